package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// stateIDFile, in the layer directory, names the state the layer images
// beside it are (RegisterHostRequest.state_id): a host whose directory
// was emptied, or a second agent on another directory under the same
// name, has another.
const stateIDFile = ".state-id"

// loadStateID returns the state ID kept in dir, making one at the first
// start. The file is written under a temporary name and renamed, so a
// crash leaves either none or a whole one.
func loadStateID(dir string) (string, error) {
	path := filepath.Join(dir, stateIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [16]byte
	rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("host state ID: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("host state ID: %w", err)
	}
	return id, nil
}
