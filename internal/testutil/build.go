package testutil

import (
	"fmt"
	"os"
	"os/exec"
)

// Build builds a package of this module (an import path such as
// github.com/kibotos/kibotos/cmd/kibotos-guest) as a static binary at out.
func Build(out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// GuestAgentPackage is the import path of the guest agent.
const GuestAgentPackage = "github.com/kibotos/kibotos/cmd/kibotos-guest"
