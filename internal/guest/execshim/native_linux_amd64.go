package execshim

import _ "embed"

//go:generate sh -c "as --64 -o shim.o shim_linux_amd64.asm && ld -static -nostdlib -s --build-id=none -z noseparate-code -e _start -o shim_linux_amd64.elf shim.o && rm shim.o"

// nativeImage is the native shim (shim_linux_amd64.asm), a static program
// of under 1 KiB.
//
//go:embed shim_linux_amd64.elf
var nativeImage []byte
