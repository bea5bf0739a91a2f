"""Quantized linears (bitsandbytes NF4) and their compute paths.

Importing this package quiets one line bitsandbytes logs when it is imported on a CPU with AVX512-BF16: "Failed to
load CPU gemm_4bit_forward from kernels-community: No module named 'kernels' ...". It is about an optional faster
CPU kernel (the `kernels` package from the Hugging Face hub) that the pack does not use: the CPU runs only the tiny
demo, through bitsandbytes' own kernels. Printed before every message of a CPU run, it read like an error. The
filter drops that record only, from that logger only; every other bitsandbytes message passes.
"""
import logging

_BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_CPU_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _QuietOptionalKernelNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_BNB_CPU_NOTICE)


def _install() -> None:
    logger = logging.getLogger(_BNB_CPU_LOGGER)
    if not any(isinstance(f, _QuietOptionalKernelNotice) for f in logger.filters):
        logger.addFilter(_QuietOptionalKernelNotice())


_install()
