curl -X PUT -H "Authorization: Bearer dev-key" -H 'Content-Type: application/json' \
  http://127.0.0.1:8080/v1/allowlists/default \
  -d '{"connections":{"demo":{"ops":["note_*","add"],"secrets":{"demo.token":"note_put.value"}}}}'
