# patchbay — `make help` lists the targets.
SHELL := bash
GO ?= go
BIN := bin

.PHONY: help build run test fuzz lint bench conformance interop screenshots generate clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build bin/server, bin/demo-mcp and bin/mcp-conformance
	$(GO) build -o $(BIN)/server ./cmd/server
	$(GO) build -o $(BIN)/demo-mcp ./cmd/demo-mcp
	$(GO) build -o $(BIN)/mcp-conformance ./cmd/mcp-conformance

run: build ## run the server on the embedded Redis with the demo connection (API key dev-key, an admin: see examples/patchbay.yaml)
	PATCHBAY_CONFIG=$${PATCHBAY_CONFIG:-examples/patchbay.yaml} ./$(BIN)/server

test: lint ## vet, format check and every test (CI=true: nothing may skip, and the fuzz targets run briefly)
	@# CI: the committed templ output must be what `make generate` makes.
	@if [ "$${CI:-}" = true ]; then $(MAKE) --no-print-directory generate && git diff --exit-code -- '*_templ.go' docs/configuration-reference.md; fi
	$(GO) test -race -count=1 ./...
	@# CI fuzzes by count, not time: Go 1.26's fuzz coordinator can fail a
	@# duration-bound run with "context deadline exceeded" at the deadline
	@# under load, with no crasher (go.dev/issue/75804, fixed in Go 1.27).
	@if [ "$${CI:-}" = true ]; then $(MAKE) --no-print-directory fuzz FUZZTIME=50000x; fi

FUZZTIME ?= 30s
fuzz: ## run each fuzz target for FUZZTIME (default 30s; a count such as 50000x also works)
	$(GO) test -run '^$$' -fuzz '^FuzzParseDocument$$' -fuzztime $(FUZZTIME) ./internal/harness/
	$(GO) test -run '^$$' -fuzz '^FuzzExpression$$' -fuzztime $(FUZZTIME) ./internal/harness/
	$(GO) test -run '^$$' -fuzz '^FuzzInline$$' -fuzztime $(FUZZTIME) ./internal/openapi/

lint: ## go vet and gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l cmd internal); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

conformance: ## run the official MCP conformance suite's client scenarios (2026-07-28, 2025-11-25, auth included) and print pass counts
	@set -o pipefail; CI=$${CI:-true} $(GO) test -count=1 -run '^TestConformance$$' -v ./internal/mcp/ \
	  | grep -E 'conformance (20|.*SUMMARY)|^(--- |ok|FAIL)|Error' | sed -E 's/^ +conformance_test.go:[0-9]+: //'

interop: ## run the interop tests against server-everything (npm) and the official Go SDK
	CI=$${CI:-true} $(GO) test -race -count=1 -run 'Interop' -v ./internal/mcp/

bench: ## run the benchmarks and print their figures
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/harness/ ./internal/harness/agent/ ./internal/api/ ./internal/mcp/
	@# Ledger cost per step, and executions/s with one and two processes at 8/32/64 clients and the
	@# POST latency at 200 submissions/s, with p50/p99, Redis commands and connections and server and
	@# Redis CPU per execution, on a real Redis (see docs/performance.md).
	PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} $(GO) test -run '^$$' -bench 'CallStep' -benchmem -count=1 ./internal/harness/
	PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} $(GO) test -run '^$$' -bench 'Executions' -benchtime 1000x -count=1 ./cmd/server/
	@# Pool leases: acquire + release with 8 slots and 64 waiters, in one process and across two processes, on a real Redis.
	PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} $(GO) test -run '^$$' -bench 'AcquireRelease' -benchtime 20000x -count=1 ./internal/pools/
	@# Webhook ingest rate and event→execution-start latency at 500 events/s, on the real Redis (127.0.0.1:6379 unless set).
	PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} $(GO) test -run '^$$' -bench . -benchtime 1x -count=1 ./internal/webhooks/
	@# OpenAPI: a call through the provider vs a plain net/http request to the same Prism (npm) and
	@# httptest endpoints, as a ratio; load time, kept heap and peak RSS for GitHub's description.
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/openapi/
	@# MCP face: the same Go SDK client calling the demo server's echo over stdio directly and through /mcp (each call an
	@# execution on the real Redis), p50/p99 of both and the difference from one run; calls/s with 64 sessions; the server's
	@# heap and RSS per idle 2025-era session.
	PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} $(GO) test -run '^$$' -bench 'ToolCall|IdleSession' -benchtime 2s -count=1 ./internal/mcpserver/
	@# Beside its peers (npm pieces into .cache/npm, redis-servers of their own on free ports): the three-call workflow of
	@# examples/hello.json with 32 clients on patchbay and on Restate 1.7.12 (a TypeScript SDK service on Node 22) at equal
	@# durability (Redis appendfsync always vs Restate's defaults; everysec vs Restate with its log's fsync off): workflows/s,
	@# p50/p99, CPU per workflow and the ratios; 100 sequential echo calls in one execution vs an MCP TypeScript SDK script and
	@# a bare mcp-go client (medians, A/B alternated); server RSS idle and with 10,000 and 100,000 executions waiting.
	$(GO) test -run '^$$' -bench 'BesideRestate' -benchtime 2000x -count=1 -timeout 30m ./cmd/server/
	$(GO) test -run '^$$' -bench 'HundredCalls|ServerRSS' -benchtime 1x -count=1 -timeout 60m ./cmd/server/

screenshots: ## take the docs' pictures again: run the browser tests docs/img/SOURCES names and copy their shots into docs/img
	@# docs/img/SOURCES is the one list of which test takes which picture (picture, shot, package,
	@# test): read here, and by internal/docs's test, which fails when the docs show a picture it
	@# does not list or a listed test no longer takes the shot. CI=true: no browser test may skip.
	@set -eo pipefail; shots=artifacts/screenshots; rows=$$(grep -v '^#' docs/img/SOURCES | awk 'NF'); \
	for shot in $$(awk '{print $$2}' <<<"$$rows"); do rm -f "$$shots/$$shot.png"; done; \
	for pkg in $$(awk '{print $$3}' <<<"$$rows" | sort -u); do \
	  tests=$$(awk -v p="$$pkg" '$$3 == p {print $$4}' <<<"$$rows" | sort -u | paste -sd'|'); \
	  echo "$$pkg: $$tests"; \
	  CI=true PATCHBAY_TEST_REDIS_URL=$${PATCHBAY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0} \
	    $(GO) test -count=1 -run '^('"$$tests"')$$' "$$pkg"; \
	done; \
	while read -r picture shot _; do \
	  if [ ! -f "$$shots/$$shot.png" ]; then echo "no $$shots/$$shot.png was taken (docs/img/$$picture)"; exit 1; fi; \
	  cp "$$shots/$$shot.png" "docs/img/$$picture"; echo "docs/img/$$picture <- $$shots/$$shot.png"; \
	done <<<"$$rows"

generate: ## regenerate generated code (the admin UI's templ components, with the templ pinned in go.mod's tool directive)
	$(GO) generate ./...

clean: ## remove build output
	rm -rf $(BIN)
