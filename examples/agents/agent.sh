# config: examples/patchbay.yaml examples/agents/models.yaml
curl -H "Authorization: Bearer dev-key" http://127.0.0.1:8080/v1/executions \
  -d '{"agent": {"model": "local/llama3.1", "instructions": "Use the notes."},
       "input": "Store the greeting hello under the key hi, then read it back.", "wait": "60s"}'
