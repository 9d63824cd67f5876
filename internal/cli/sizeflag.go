package cli

// ParseMiB parses a SIZE flag value (see parseSize) that must be a whole
// number of MiB, for the commands outside this package that take one;
// name names the flag ("--volume-size") in errors.
func ParseMiB(name, s string) (uint64, error) { return parseMiB(name, s) }
