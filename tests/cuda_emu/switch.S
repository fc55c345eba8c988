/*
 * switch.S - the CUDA emulator's fiber switch (x86-64 System V): saves the
 * callee-saved registers of the running context on its stack (not the
 * SSE/x87 control words: emulated threads never change rounding modes), stores its stack pointer in *save and
 * resumes the context whose stack pointer is `to`. A new fiber's stack is
 * laid out by kernel.cc so that the first switch to it "returns" into
 * dpemu_fiber_tramp, which calls r13(r12).
 *
 *   void dpemu_switch(void **save, void *to);
 */
	.text
	.globl	dpemu_switch
	.hidden	dpemu_switch
	.type	dpemu_switch, @function
dpemu_switch:
	pushq	%rbp
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	movq	%rsp, (%rdi)
	movq	%rsi, %rsp
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	ret
	.size	dpemu_switch, .-dpemu_switch

	.globl	dpemu_fiber_tramp
	.hidden	dpemu_fiber_tramp
	.type	dpemu_fiber_tramp, @function
dpemu_fiber_tramp:
	movq	%r12, %rdi
	callq	*%r13
	ud2
	.size	dpemu_fiber_tramp, .-dpemu_fiber_tramp

	.section .note.GNU-stack,"",@progbits
