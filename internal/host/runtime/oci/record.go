package oci

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"
)

// record is what StateDir/exec/<id>/record.json keeps of an execution:
// enough to release it after a crash of the host agent. It is written
// before the first thing it names is set up.
type record struct {
	ID         string    `json:"id"`
	Runtime    string    `json:"runtime"`
	LayerImage string    `json:"layer_image"`
	Layers     []string  `json:"layers"`
	LoopDevice string    `json:"loop_device,omitempty"`
	LayerMount string    `json:"layer_mount"`
	RootfsPath string    `json:"rootfs"`
	SocketDir  string    `json:"socket_dir"`
	Cgroup     string    `json:"cgroup"`
	CreatedAt  time.Time `json:"created_at"`
	// The volume, if the execution has one: its image, where the host
	// mounts it (StateDir/exec/<id>/volume) and its loop device.
	VolumeImage  string `json:"volume_image,omitempty"`
	VolumeMount  string `json:"volume_mount,omitempty"`
	VolumeDevice string `json:"volume_device,omitempty"`
}

const recordFile = "record.json"

func (d *Driver) readRecord(id string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(d.dir(id), recordFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// writeRecord replaces the record atomically.
func (d *Driver) writeRecord(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(d.dir(r.ID), recordFile), b, 0o600)
}

// writeFileAtomic writes path through a temporary file and a rename, and
// syncs it, so a crash leaves the old or the new content.
func writeFileAtomic(path string, b []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// knownIDs returns the executions that have a directory in StateDir/exec.
func (d *Driver) knownIDs() ([]string, error) {
	ents, err := os.ReadDir(d.execDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
