# Kibotos: `make up` installs what is missing, builds and starts the embedded
# deployment; `make test` installs what is missing and runs every test.
# Both run as root on Debian 12 (see DEVELOPERS.md).

SHELL := /bin/sh
# The machine's Go lives here; make works from a shell without it on PATH.
export PATH := $(CURDIR)/.bin:/usr/local/go/bin:$(PATH)
export CGO_ENABLED ?= 0

KIBOTOS_HOME ?= /var/lib/kibotos
KIBOTOS_LISTEN ?= 127.0.0.1:8870
export KIBOTOS_HOME KIBOTOS_LISTEN

# Code generators, pinned; `make tools` builds them into .bin.
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.19.1

.PHONY: all deps build console up down test fuzz generate tools lint

all: build

deps:
	scripts/install-deps

# build bundles the web console (console/, npm) into internal/ctrl/console/dist,
# which the kibotos binary embeds, then builds the binaries.
build: console
	go build -trimpath -o bin/kibotos ./cmd/kibotos
	go build -trimpath -ldflags=-s -o bin/kibotos-guest ./cmd/kibotos-guest

up: deps build
	scripts/up

down:
	scripts/down

test: deps tools console
	scripts/test

# fuzz runs every fuzz target for FUZZTIME each (see DEVELOPERS.md).
FUZZTIME ?= 5m
fuzz:
	scripts/fuzz $(FUZZTIME)

tools: .bin/buf-$(BUF_VERSION) .bin/protoc-gen-go-$(PROTOC_GEN_GO_VERSION) .bin/protoc-gen-connect-go-$(PROTOC_GEN_CONNECT_GO_VERSION)

.bin/buf-$(BUF_VERSION):
	GOBIN=$(CURDIR)/.bin go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	touch $@
.bin/protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	GOBIN=$(CURDIR)/.bin go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	touch $@
.bin/protoc-gen-connect-go-$(PROTOC_GEN_CONNECT_GO_VERSION):
	GOBIN=$(CURDIR)/.bin go install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
	touch $@

# generate rewrites gen/ and sdk/typescript/gen/ from proto/; `make test`
# fails when they differ.
generate: tools sdk/typescript/node_modules
	buf lint
	buf generate
	buf generate --template sdk/typescript/buf.gen.yaml

# console bundles the web console with the packages console/package-lock.json
# pins (npm ci once per lockfile change).
console: console/node_modules
	cd console && npm run build

console/node_modules: console/package-lock.json
	cd console && npm ci --no-audit --no-fund
	touch $@

# The TypeScript SDK's packages, protoc-gen-es among them, as pinned.
sdk/typescript/node_modules: sdk/typescript/package-lock.json
	cd sdk/typescript && npm ci --no-audit --no-fund
	touch $@

lint: tools
	buf lint
	scripts/check-go
