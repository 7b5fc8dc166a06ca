# patchbay — `make help` lists the targets.
SHELL := bash
GO ?= go
BIN := bin
PATCHBAY_API_KEYS ?= dev-key
export PATCHBAY_API_KEYS

.PHONY: help build run test lint bench generate clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build bin/server and bin/demo-mcp
	$(GO) build -o $(BIN)/server ./cmd/server
	$(GO) build -o $(BIN)/demo-mcp ./cmd/demo-mcp

run: build ## run the server on the embedded Redis with the demo connection (API key: $$PATCHBAY_API_KEYS, default dev-key)
	PATCHBAY_CONFIG=$${PATCHBAY_CONFIG:-examples/patchbay.yaml} ./$(BIN)/server

test: lint ## vet, format check and every test (CI=true: nothing may skip)
	$(GO) test -race -count=1 ./...

lint: ## go vet and gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l cmd internal); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

bench: ## run the benchmarks and print their figures
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/harness/ ./internal/api/ ./internal/mcp/

generate: ## regenerate generated code (templ components, once the admin UI exists)
	$(GO) generate ./...

clean: ## remove build output
	rm -rf $(BIN)
