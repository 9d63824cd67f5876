// Package config reads the configuration file of `kibotos up`, `kibotos
// ctrl` and `kibotos host` (--config FILE): a YAML mapping whose keys are the
// command's flag names, without the dashes in front, and whose values are
// what the flag takes (a list for a repeatable flag). A flag given on the
// command line overrides the file; the file overrides the environment
// variables that flags default to.
//
//	listen: 0.0.0.0:8870
//	log-format: json
//	insecure-registry: [127.0.0.1:5000]
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// FlagName is the flag that names the file; it cannot be set in the file.
const FlagName = "config"

// Apply sets every flag of fs that the file at path names and the command
// line did not set. An unknown key, a value of the wrong shape or one the
// flag refuses is an error naming the key.
func Apply(fs *pflag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var doc map[string]yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	for key, node := range doc {
		f := fs.Lookup(key)
		if f == nil || key == FlagName || key == "help" {
			return fmt.Errorf("config %s: %q is not a setting of this command (the settings are its flags, such as listen)", path, key)
		}
		if f.Changed {
			continue
		}
		if err := set(f, node); err != nil {
			return fmt.Errorf("config %s: %s: %w", path, key, err)
		}
	}
	return nil
}

// set gives f the node's value: a scalar, or for a repeatable flag a list
// of scalars (a scalar is a list of one).
func set(f *pflag.Flag, node yaml.Node) error {
	switch node.Kind {
	case yaml.ScalarNode:
		if err := f.Value.Set(node.Value); err != nil {
			return err
		}
	case yaml.SequenceNode:
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return errors.New("takes one value, not a list")
		}
		var items []string
		for _, n := range node.Content {
			if n.Kind != yaml.ScalarNode {
				return errors.New("want a list of plain values")
			}
			items = append(items, n.Value)
		}
		if err := sv.Replace(items); err != nil {
			return err
		}
	default:
		return errors.New("want a plain value or a list of them, not a mapping")
	}
	f.Changed = true
	return nil
}
