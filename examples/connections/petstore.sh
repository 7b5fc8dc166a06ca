# config: examples/petstore.yaml
curl -s -H "Authorization: Bearer dev-key" -d @examples/petstore.json http://127.0.0.1:8080/v1/executions
