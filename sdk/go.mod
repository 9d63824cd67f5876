module github.com/kibotos/kibotos/sdk

go 1.24.0

require (
	connectrpc.com/connect v1.19.1
	github.com/google/uuid v1.6.0
	github.com/kibotos/kibotos/gen v0.0.0-00010101000000-000000000000
	google.golang.org/protobuf v1.36.12
)

replace github.com/kibotos/kibotos/gen => ../gen
