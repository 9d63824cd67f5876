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

.PHONY: all deps build console install up down test fuzz generate tools lint

# The version and commit `kibotos version`, /metrics and the logs report.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/kibotos/kibotos/internal/buildinfo.version=$(VERSION) -X github.com/kibotos/kibotos/internal/buildinfo.commit=$(COMMIT)

# Where `make install` puts things; DESTDIR stages them elsewhere.
PREFIX ?= /usr/local
SYSTEMD_DIR ?= /etc/systemd/system
CONFIG_DIR ?= /etc/kibotos

all: build

deps:
	scripts/install-deps

# build bundles the web console (console/, npm) into internal/ctrl/console/dist,
# which kibotos-server embeds, then builds the binaries: kibotos (the CLI),
# kibotos-server (the server verbs, which `kibotos up` runs) and the guest agent.
build: console
	go build -trimpath -ldflags '$(LDFLAGS)' -o bin/kibotos ./cmd/kibotos
	go build -trimpath -ldflags '$(LDFLAGS)' -o bin/kibotos-server ./cmd/kibotos-server
	go build -trimpath -ldflags=-s -o bin/kibotos-guest ./cmd/kibotos-guest

# install puts the binaries in PREFIX/bin, the systemd unit in SYSTEMD_DIR
# and, unless one is there, the sample config in CONFIG_DIR/config.yaml.
install: build
	install -D -m 0755 bin/kibotos $(DESTDIR)$(PREFIX)/bin/kibotos
	install -D -m 0755 bin/kibotos-server $(DESTDIR)$(PREFIX)/bin/kibotos-server
	install -D -m 0755 bin/kibotos-guest $(DESTDIR)$(PREFIX)/bin/kibotos-guest
	sed 's|/usr/local/bin/kibotos|$(PREFIX)/bin/kibotos|; s|/etc/kibotos/|$(CONFIG_DIR)/|' deploy/kibotos.service >deploy/.kibotos.service
	install -D -m 0644 deploy/.kibotos.service $(DESTDIR)$(SYSTEMD_DIR)/kibotos.service
	rm -f deploy/.kibotos.service
	install -d -m 0755 $(DESTDIR)$(CONFIG_DIR)
	[ -e $(DESTDIR)$(CONFIG_DIR)/config.yaml ] || install -m 0600 deploy/config.yaml $(DESTDIR)$(CONFIG_DIR)/config.yaml

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

# generate rewrites gen/ (but its go.mod: gen/ is the module of the
# generated API) and sdk/typescript/gen/ from proto/; `make test` fails
# when they differ.
generate: tools sdk/typescript/node_modules
	buf lint
	rm -rf gen/kibotos
	buf generate
	buf generate --template sdk/typescript/buf.gen.yaml
	scripts/build-shim internal/guest/execshim/shim_linux_amd64.elf

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
