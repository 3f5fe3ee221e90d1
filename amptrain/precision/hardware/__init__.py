"""What the hardware does with each precision, in one place: :mod:`.devices` (which device,
its CPU flags and GPU properties), :mod:`.support` (which modes run natively, which are
emulated or refused, what ``auto`` picks), :mod:`.advice` (the advice worded from those
facts) and :mod:`.probe` (the machine report ``amptrain env`` and every study embed).

Imports run one way: devices <- support <- advice <- probe. The numerics of emulation
(:mod:`amptrain.precision.emulation`) and of the low-bit formats stay with the modes.
"""
