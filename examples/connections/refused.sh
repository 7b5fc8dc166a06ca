# config: examples/petstore.yaml
curl -s -H "Authorization: Bearer dev-key" http://127.0.0.1:8080/v1/executions -d '{"wait": "10s", "workflow": {"version": 1, "connections": {"pets": {}},
  "root": {"kind": "call", "id": "read", "connection": "pets", "op": "getPetById", "args": {"petId": "ten"}}}}'
