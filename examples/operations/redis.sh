# needs: redis
curl -s http://127.0.0.1:8080/readyz
curl -s -H "Authorization: Bearer dev-key" -d @examples/hello.json http://127.0.0.1:8080/v1/executions | jq -r .status
