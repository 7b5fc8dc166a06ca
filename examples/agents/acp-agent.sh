# config: examples/patchbay.yaml examples/agents/codex.yaml
# needs: codex-acp (npx) and an OpenAI key stored as the secret openai.key
curl -H "Authorization: Bearer dev-key" http://127.0.0.1:8080/v1/executions -d '{"workflow": {
  "version": 1, "connections": {"demo": {}},
  "root": {"kind": "acp-agent", "id": "coder", "agent": "codex",
           "prompt": "Add 2 and 3 with the demo tools and say the sum.",
           "tools": [{"connection": "demo", "ops": ["add"]}]}}}'
