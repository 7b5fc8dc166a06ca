jq '{workflow: ., input: {a: 2}, wait: "10s"}' examples/workflows/document.json |
  curl -s -H "Authorization: Bearer dev-key" -d @- http://127.0.0.1:8080/v1/executions | jq '{status, output}'
