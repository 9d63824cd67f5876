package pid1

import (
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// RecordEnd records in dir (the agent's socket directory) how the guest
// ends, guestabi.EndReset or guestabi.EndShutdown, for the host to read
// once the agent has exited. It replaces whatever the guest left at the
// name, a link included, without following it.
func RecordEnd(dir, end string) error {
	f, err := os.CreateTemp(dir, ".end-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(end + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, guestabi.EndFile))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
