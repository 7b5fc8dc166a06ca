# config: examples/tasks.yaml
id=$(curl -s -H "Authorization: Bearer dev-key" -d @examples/slow-job.json http://127.0.0.1:8080/v1/executions | jq -r .id)
curl -N -H "Authorization: Bearer dev-key" http://127.0.0.1:8080/v1/executions/$id/events
curl -s -H "Authorization: Bearer dev-key" http://127.0.0.1:8080/v1/executions/$id | jq .output
