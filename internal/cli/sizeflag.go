package cli

// ParseMiB parses a SIZE flag value (see parseSize) that must be a whole
// number of MiB, for the commands outside this package that take one;
// flag names the flag in errors.
func ParseMiB(flag, s string) (uint64, error) { return parseMiB(flag, s) }
