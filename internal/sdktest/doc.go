// Package sdktest holds the tests of the Go SDK (module
// github.com/kibotos/kibotos/sdk) that run against this module's server:
// a real `kibotos up` in-process (internal/daemon/uptest), or the guest's
// data plane in-process. They live here because the SDK's module does not
// depend on the server's; the SDK's own unit tests stay beside it.
package sdktest
