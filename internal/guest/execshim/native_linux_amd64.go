package execshim

import _ "embed"

//go:generate ../../../scripts/build-shim shim_linux_amd64.elf

// nativeImage is the native shim (shim_linux_amd64.asm), a static program
// of under 1 KiB.
//
//go:embed shim_linux_amd64.elf
var nativeImage []byte
