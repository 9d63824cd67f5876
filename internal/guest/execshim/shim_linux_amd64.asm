# The native exec shim for linux/amd64 (see execshim.go; go generate builds
# shim_linux_amd64.elf from this file with binutils): a static program that
# sets its oom_score_adj to 0 and execs argv[1] with argv[2:] and its
# environment. Descriptor 3 is the report pipe (made close-on-exec here),
# descriptor 4 its own image (closed). A failure is reported on 3 as the
# stage byte ('a' or 'e') and the errno (little endian uint32), then it
# exits with 127. No libc: system calls only.
	.intel_syntax noprefix
	.globl	_start
	.text
_start:
	mov	r12, rsp		# [r12] argc, [r12+8] argv
	mov	eax, 3			# close(4)
	mov	edi, 4
	syscall
	mov	eax, 72			# fcntl(3, F_SETFD, FD_CLOEXEC)
	mov	edi, 3
	mov	esi, 2
	mov	edx, 1
	syscall
	mov	esi, 1			# O_WRONLY
	call	openadj
	test	rax, rax
	js	.Lwritefailed
	mov	r14, rax
	mov	eax, 1			# write(fd, "0", 1)
	mov	rdi, r14
	lea	rsi, [rip + zero]
	mov	edx, 1
	syscall
	mov	r13, rax
	mov	eax, 3			# close(fd)
	mov	rdi, r14
	syscall
	test	r13, r13
	jns	.Lexec
	mov	rax, r13
.Lwritefailed:
	# Raising needs no privilege, so this is rare; it only matters if
	# the score stays below 0.
	neg	rax
	mov	r13, rax		# the write's errno
	xor	esi, esi		# O_RDONLY
	call	openadj
	test	rax, rax
	js	.Lreadfailed
	mov	r14, rax
	xor	eax, eax		# read(fd, rsp-8, 1)
	mov	rdi, r14
	lea	rsi, [rsp - 8]
	mov	byte ptr [rsi], 0
	mov	edx, 1
	syscall
	mov	r15, rax
	mov	eax, 3			# close(fd)
	mov	rdi, r14
	syscall
	test	r15, r15
	js	.Lreaderrno
	jz	.Lreadempty
	cmp	byte ptr [rsp - 8], '-'
	jne	.Lexec
	mov	bl, 'a'
	jmp	.Lreport
.Lreaderrno:
	mov	rax, r15
.Lreadfailed:
	neg	rax
	mov	r13, rax
	mov	bl, 'a'
	jmp	.Lreport
.Lreadempty:
	xor	r13d, r13d
	mov	bl, 'a'
	jmp	.Lreport
.Lexec:
	mov	rax, [r12]		# envp = argv + argc + 1
	lea	rdx, [r12 + 8*rax + 16]
	mov	rdi, [r12 + 16]		# argv[1]
	lea	rsi, [r12 + 24]		# argv + 2
	mov	eax, 59			# execve
	syscall
	neg	rax
	mov	r13, rax
	mov	bl, 'e'
.Lreport:
	sub	rsp, 8
	mov	byte ptr [rsp], bl
	mov	dword ptr [rsp + 1], r13d
	mov	eax, 1			# write(3, report, 5)
	mov	edi, 3
	mov	rsi, rsp
	mov	edx, 5
	syscall
	mov	eax, 231		# exit_group(127)
	mov	edi, 127
	syscall

# openadj opens /proc/self/oom_score_adj with the flags in esi.
openadj:
	mov	edx, esi
	mov	eax, 257		# openat(AT_FDCWD, path, flags)
	mov	rdi, -100
	lea	rsi, [rip + adjpath]
	syscall
	ret

adjpath:
	.asciz	"/proc/self/oom_score_adj"
zero:
	.ascii	"0"
