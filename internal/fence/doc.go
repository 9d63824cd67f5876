// Package fence holds no code: its test keeps the planes apart. The control
// plane (internal/ctrl), the host (internal/host) and the guest
// (internal/guest) never import each other; each may import the generated
// API and the shared leaves, and only the deployment's wiring
// (internal/daemon, cmd/kibotos) imports more than one plane.
package fence
