# config: examples/connections/openapi.yaml
# needs: the API that file names (petstore.example.com stands in for yours)
curl -s localhost:8080/v1/executions -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d '{
  "wait": "10s", "input": {"name": "Rex"},
  "workflow": {"version": 1, "connections": {"pets": {}}, "root": {"kind": "sequence", "id": "main", "steps": [
    {"kind": "call", "id": "create", "connection": "pets", "op": "createPet", "args": {"name": {"$expr": "$input.name"}}},
    {"kind": "call", "id": "read", "connection": "pets", "op": "showPetById", "args": {"petId": {"$expr": "$steps.create.id"}}}]}}}'
