"""KV precision as one value: made once from the settings, read by the engine (what KV is
computed, kept and written at), the warm tier (its folder's name, every block file's fields)
and the `cache` commands. No MLX here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVPrecision:
    """The KV precision of a tier: bits 16 means unquantized, in the model's dtype."""

    bits: int = 16
    group_size: int = 64

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    @property
    def tag(self) -> str:
        """How folders and /health name it: `q4g64`, `kv16`."""
        return f"q{self.bits}g{self.group_size}" if self.quantized else "kv16"

    def file_meta(self) -> dict[str, str]:
        """What every block file at this precision says about it (checked on read)."""
        return {"bits": str(self.bits), "group_size": str(self.group_size if self.quantized else 0)}


FULL = KVPrecision()


@dataclass(frozen=True)
class Precisions:
    """The engine's precisions: of cached blocks in memory (`hot`, what a block cools to), of
    running sequences' caches (`working`, what decoding attends to) and of block files (`disk`)."""

    hot: KVPrecision
    working: KVPrecision
    disk: KVPrecision

    @classmethod
    def of(cls, kv_bits: int, group_size: int, disk_kv_bits: int | None = None, decode_quantized: bool = False) -> Precisions:
        """From the settings (--kv-bits, --kv-group-size, --disk-kv-bits, --decode-quantized)."""
        hot = KVPrecision(kv_bits, group_size)
        disk = KVPrecision(disk_kv_bits, group_size) if disk_kv_bits else hot
        return cls(hot=hot, working=hot if decode_quantized else FULL, disk=disk)

    @property
    def exact_while_hot(self) -> bool:
        """Computed KV is kept as computed until it cools (working is finer than hot)."""
        return self.working != self.hot
