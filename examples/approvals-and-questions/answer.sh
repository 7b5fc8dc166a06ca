# config: examples/tasks.yaml examples/approvals-and-questions/approver.yaml
curl -s -H "Authorization: Bearer dev-key" -d @examples/approvals-and-questions/confirm-job.json http://127.0.0.1:8080/v1/executions
curl -s -H "Authorization: Bearer dev-key" 'http://127.0.0.1:8080/v1/questions?state=pending'
id=$(curl -s -H "Authorization: Bearer dev-key" 'http://127.0.0.1:8080/v1/questions?state=pending' | jq -r '.items[0].id')
curl -s -H "Authorization: Bearer ada-key" http://127.0.0.1:8080/v1/questions/$id/answer \
  -H 'Content-Type: application/json' -d '{"content": {"ok": true}}'
