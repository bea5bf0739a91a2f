"""The weights modes that read a stored low-precision folder (quant/lowp_format.FORMATS has one row each), in a
module without torch so that the CLI's flag checks can name them before the heavy imports."""

LOWP_WEIGHTS = ("fp8", "int8")
