// Copies and atomics into application memory, and a probe of it, that a fault does not end
// (link/placement_guard.h). Each function is a leaf that touches no stack: a fault inside
// [softrdma_guarded_begin, softrdma_guarded_end) is resumed by our SIGSEGV or SIGBUS handler at
// softrdma_guarded_fault_exit, which returns {0, 0} from whichever function faulted. Every
// function returns {value, 1} in rax:rdx.
#if defined(__x86_64__)

	.text
	.globl softrdma_guarded_begin, softrdma_guarded_end, softrdma_guarded_fault_exit
	.globl softrdma_guarded_place, softrdma_guarded_store8
	.globl softrdma_guarded_compare_swap, softrdma_guarded_fetch_add, softrdma_guarded_probe
	.hidden softrdma_guarded_begin, softrdma_guarded_end, softrdma_guarded_fault_exit
	.hidden softrdma_guarded_place, softrdma_guarded_store8
	.hidden softrdma_guarded_compare_swap, softrdma_guarded_fetch_add, softrdma_guarded_probe

// Copies 8 bytes at a time from (%rsi) to (%rdi), advancing both, while \count holds 8 or more.
	.macro COPY_WORDS count
.Lwords\@:
	cmpq	$8, \count
	jb	.Lwords_done\@
	movq	(%rsi), %rax
	movq	%rax, (%rdi)
	addq	$8, %rsi
	addq	$8, %rdi
	subq	$8, \count
	jmp	.Lwords\@
.Lwords_done\@:
	.endm

// Copies the \count bytes left one store each.
	.macro COPY_BYTES count
.Lbytes\@:
	testq	\count, \count
	jz	.Lbytes_done\@
	movzbl	(%rsi), %eax
	movb	%al, (%rdi)
	incq	%rsi
	incq	%rdi
	decq	\count
	jmp	.Lbytes\@
.Lbytes_done\@:
	.endm

	.p2align 4
softrdma_guarded_begin:

// {0, 1} softrdma_guarded_place(void* dst /* rdi */, const void* src /* rsi */, size_t n /* rdx */)
// As link::PlaceBytes: every byte once, ascending; all but the last 64 bytes first, then the last
// 64 bytes: byte stores up to an 8-byte boundary, aligned 8-byte stores, byte stores.
// The bulk goes by rep movsb from 1 KiB on, below by 16-byte SSE2 moves, four a round (rep movsb
// starts slowly: 8.4-10 ns for 128-512 bytes against 2.4-5.7 ns, here; the words this loop had
// took 6.3 ns for 256 bytes, 14 ns for 512, and ib_read_bw 512 B ran at 0.82 of ib_write_bw).
	.type softrdma_guarded_place, @function
softrdma_guarded_place:
	cmpq	$64, %rdx
	jbe	.Ltail
	leaq	-64(%rdx), %rcx
	movl	$64, %edx
	cmpq	$1024, %rcx
	jb	.Lbulk_vectors
	rep movsb
	jmp	.Ltail
.Lbulk_vectors:
	cmpq	$64, %rcx
	jb	.Lbulk_sixteens
	movdqu	(%rsi), %xmm0
	movdqu	16(%rsi), %xmm1
	movdqu	32(%rsi), %xmm2
	movdqu	48(%rsi), %xmm3
	movdqu	%xmm0, (%rdi)
	movdqu	%xmm1, 16(%rdi)
	movdqu	%xmm2, 32(%rdi)
	movdqu	%xmm3, 48(%rdi)
	addq	$64, %rsi
	addq	$64, %rdi
	subq	$64, %rcx
	jmp	.Lbulk_vectors
.Lbulk_sixteens:
	cmpq	$16, %rcx
	jb	.Lbulk_words
	movdqu	(%rsi), %xmm0
	movdqu	%xmm0, (%rdi)
	addq	$16, %rsi
	addq	$16, %rdi
	subq	$16, %rcx
	jmp	.Lbulk_sixteens
.Lbulk_words:
	COPY_WORDS %rcx
	COPY_BYTES %rcx
.Ltail:
	testq	%rdx, %rdx
	jz	.Ldone
	testq	$7, %rdi
	jz	.Ltail_aligned
	movzbl	(%rsi), %eax
	movb	%al, (%rdi)
	incq	%rsi
	incq	%rdi
	decq	%rdx
	jmp	.Ltail
.Ltail_aligned:
	COPY_WORDS %rdx
	COPY_BYTES %rdx
.Ldone:
	xorl	%eax, %eax
	movl	$1, %edx
	ret
	.size softrdma_guarded_place, . - softrdma_guarded_place

// {0, 1} softrdma_guarded_store8(void* p /* rdi */, uint64_t value /* rsi */): one store, at any
// alignment (an atomic's result, which nobody polls byte by byte); the general copy's loops cost an
// atomic ~10 ns.
	.type softrdma_guarded_store8, @function
softrdma_guarded_store8:
	movq	%rsi, (%rdi)
	xorl	%eax, %eax
	movl	$1, %edx
	ret
	.size softrdma_guarded_store8, . - softrdma_guarded_store8

// {old, 1} softrdma_guarded_compare_swap(uint64_t* p /* rdi */, uint64_t compare /* rsi */,
//                                        uint64_t swap /* rdx */)
	.type softrdma_guarded_compare_swap, @function
softrdma_guarded_compare_swap:
	movq	%rsi, %rax
	lock cmpxchgq %rdx, (%rdi)
	movl	$1, %edx
	ret
	.size softrdma_guarded_compare_swap, . - softrdma_guarded_compare_swap

// {old, 1} softrdma_guarded_fetch_add(uint64_t* p /* rdi */, uint64_t add /* rsi */)
	.type softrdma_guarded_fetch_add, @function
softrdma_guarded_fetch_add:
	lock xaddq %rsi, (%rdi)
	movq	%rsi, %rax
	movl	$1, %edx
	ret
	.size softrdma_guarded_fetch_add, . - softrdma_guarded_fetch_add

// {0, 1} softrdma_guarded_probe(const void* p /* rdi */, size_t n /* rsi */): reads one byte of
// every 4 KiB page [p, p + n) touches (a page is readable whole or not at all).
	.type softrdma_guarded_probe, @function
softrdma_guarded_probe:
	testq	%rsi, %rsi
	jz	.Lprobed
	leaq	-1(%rdi,%rsi), %rcx
.Lprobe_page:
	movzbl	(%rdi), %eax
	orq	$4095, %rdi
	incq	%rdi
	cmpq	%rcx, %rdi
	jbe	.Lprobe_page
.Lprobed:
	xorl	%eax, %eax
	movl	$1, %edx
	ret
	.size softrdma_guarded_probe, . - softrdma_guarded_probe
softrdma_guarded_end:

	.type softrdma_guarded_fault_exit, @function
softrdma_guarded_fault_exit:
	xorl	%eax, %eax
	xorl	%edx, %edx
	ret
	.size softrdma_guarded_fault_exit, . - softrdma_guarded_fault_exit

#endif
	.section .note.GNU-stack, "", @progbits
