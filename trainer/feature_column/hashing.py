"""TensorFlow's feature hashing, vectorised: FarmHash ``Fingerprint64`` and ``FingerprintCat64``.

* :func:`fingerprint64` is ``tf.fingerprint(..., 'farmhash64')``, the hash of
  ``tf.strings.to_hash_bucket_fast`` (``Fingerprint64(s) % num_buckets``): FarmHash's
  ``farmhashna::Hash64`` of a string's UTF-8 bytes.  Integers hash as their decimal string,
  as ``categorical_column_with_hash_bucket`` and vocabulary OOV buckets do
  (``tf.strings.as_string`` before hashing).
* :func:`fingerprint_cat64` is the combine step of ``tf.sparse.cross_hashed``
  (``crossed_column``): ``FingerprintCat64(hash_key, f_1), ..., f_n)`` where ``f_i`` is
  ``Fingerprint64`` of a string input and the value itself of an integer input.

The per-value work is a numba kernel over the whole batch (no Python loop over values); a
numpy unicode array is encoded to UTF-8 inside the kernel, integers are formatted inside it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tierserve.core.errors import InvalidInputError

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_KMUL = np.uint64(0xC6A4A7935BD1E995)  # FingerprintCat64's multiplier
#: ``sparse_cross_hashed``'s hash_key when none is given (``_DEFAULT_HASH_KEY``).
DEFAULT_HASH_KEY = 0xDECAFCAFFE


@njit(cache=True, inline="always")
def _rot(v, s):
    if s == 0:
        return v
    return (v >> np.uint64(s)) | (v << np.uint64(64 - s))


@njit(cache=True, inline="always")
def _shift_mix(v):
    return v ^ (v >> np.uint64(47))


@njit(cache=True, inline="always")
def _fetch(b, p, nbytes):
    """The little-endian integer of ``b[p:p + nbytes]`` (FarmHash's Fetch64 / Fetch32)."""
    v = np.uint64(0)
    for k in range(nbytes):
        v |= np.uint64(b[p + k]) << np.uint64(8 * k)
    return v


@njit(cache=True, inline="always")
def _fetch64(b, p):
    return _fetch(b, p, 8)


@njit(cache=True, inline="always")
def _len16(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> np.uint64(47)
    b = (v ^ a) * mul
    b ^= b >> np.uint64(47)
    return b * mul


@njit(cache=True)
def _len0to16(b, n):
    if n >= 8:
        mul = _K2 + np.uint64(n) * np.uint64(2)
        a = _fetch64(b, 0) + _K2
        c0 = _fetch64(b, n - 8)
        c = _rot(c0, 37) * mul + a
        d = (_rot(a, 25) + c0) * mul
        return _len16(c, d, mul)
    if n >= 4:
        mul = _K2 + np.uint64(n) * np.uint64(2)
        a = _fetch(b, 0, 4)
        return _len16(np.uint64(n) + (a << np.uint64(3)), _fetch(b, n - 4, 4), mul)
    if n > 0:
        a = np.uint64(b[0])
        c1 = np.uint64(b[n >> 1])
        c2 = np.uint64(b[n - 1])
        y = (a + (c1 << np.uint64(8))) & np.uint64(0xFFFFFFFF)
        z = (np.uint64(n) + (c2 << np.uint64(2))) & np.uint64(0xFFFFFFFF)
        return _shift_mix(y * _K2 ^ z * _K0) * _K2
    return _K2


@njit(cache=True)
def _len17to32(b, n):
    mul = _K2 + np.uint64(n) * np.uint64(2)
    a = _fetch64(b, 0) * _K1
    c0 = _fetch64(b, 8)
    c = _fetch64(b, n - 8) * mul
    d = _fetch64(b, n - 16) * _K2
    return _len16(_rot(a + c0, 43) + _rot(c, 30) + d, a + _rot(c0 + _K2, 18) + c, mul)


@njit(cache=True)
def _len33to64(b, n):
    mul = _K2 + np.uint64(n) * np.uint64(2)
    a = _fetch64(b, 0) * _K2
    c0 = _fetch64(b, 8)
    c = _fetch64(b, n - 8) * mul
    d = _fetch64(b, n - 16) * _K2
    y = _rot(a + c0, 43) + _rot(c, 30) + d
    z = _len16(y, a + _rot(c0 + _K2, 18) + c, mul)
    e = _fetch64(b, 16) * mul
    f = _fetch64(b, 24)
    g = (y + _fetch64(b, n - 32)) * mul
    h = (z + _fetch64(b, n - 24)) * mul
    return _len16(_rot(e + f, 43) + _rot(g, 30) + h, e + _rot(f + a, 18) + g, mul)


@njit(cache=True, inline="always")
def _weak32(b, p, a, c):
    w = _fetch64(b, p)
    x = _fetch64(b, p + 8)
    y = _fetch64(b, p + 16)
    z = _fetch64(b, p + 24)
    a += w
    c = _rot(c + a + z, 21)
    t = a
    a += x
    a += y
    c += _rot(a, 44)
    return a + z, c + t


@njit(cache=True)
def _hash64(b, n):
    """farmhashna::Hash64 of the first ``n`` bytes of uint8 array ``b``."""
    if n <= 16:
        return _len0to16(b, n)
    if n <= 32:
        return _len17to32(b, n)
    if n <= 64:
        return _len33to64(b, n)
    seed = np.uint64(81)
    x = seed
    y = seed * _K1 + np.uint64(113)
    z = _shift_mix(y * _K2 + np.uint64(113)) * _K2
    v0 = np.uint64(0)
    v1 = np.uint64(0)
    w0 = np.uint64(0)
    w1 = np.uint64(0)
    x = x * _K2 + _fetch64(b, 0)
    end = ((n - 1) // 64) * 64
    last64 = n - 64
    p = 0
    while True:
        x = _rot(x + y + v0 + _fetch64(b, p + 8), 37) * _K1
        y = _rot(y + v1 + _fetch64(b, p + 48), 42) * _K1
        x ^= w1
        y += v0 + _fetch64(b, p + 40)
        z = _rot(z + w0, 33) * _K1
        v0, v1 = _weak32(b, p, v1 * _K1, x + w0)
        w0, w1 = _weak32(b, p + 32, z + w1, y + _fetch64(b, p + 16))
        z, x = x, z
        p += 64
        if p == end:
            break
    mul = _K1 + ((z & np.uint64(0xFF)) << np.uint64(1))
    p = last64
    w0 += np.uint64((n - 1) & 63)
    v0 += w0
    w0 += v0
    x = _rot(x + y + v0 + _fetch64(b, p + 8), 37) * mul
    y = _rot(y + v1 + _fetch64(b, p + 48), 42) * mul
    x ^= w1 * np.uint64(9)
    y += v0 * np.uint64(9) + _fetch64(b, p + 40)
    z = _rot(z + w0, 33) * mul
    v0, v1 = _weak32(b, p, v1 * mul, x + w0)
    w0, w1 = _weak32(b, p + 32, z + w1, y + _fetch64(b, p + 16))
    z, x = x, z
    return _len16(_len16(v0, w0, mul) + _shift_mix(y) * _K0 + z, _len16(v1, w1, mul) + x, mul)


@njit(cache=True)
def _fp_bytes(raw, lengths):
    out = np.empty(raw.shape[0], np.uint64)
    for i in range(raw.shape[0]):
        out[i] = _hash64(raw[i], lengths[i])
    return out


@njit(cache=True)
def _fp_unicode(codes):
    """Rows of UCS-4 code points (NUL-padded, as numpy stores ``<U`` strings): UTF-8 encode
    each row, then hash it."""
    n, width = codes.shape
    buf = np.zeros(4 * width + 8, np.uint8)
    out = np.empty(n, np.uint64)
    for i in range(n):
        m = width
        while m > 0 and codes[i, m - 1] == 0:
            m -= 1
        k = 0
        for j in range(m):
            c = codes[i, j]
            if c < 0x80:
                buf[k] = c
                k += 1
            elif c < 0x800:
                buf[k] = 0xC0 | (c >> 6)
                buf[k + 1] = 0x80 | (c & 0x3F)
                k += 2
            elif c < 0x10000:
                buf[k] = 0xE0 | (c >> 12)
                buf[k + 1] = 0x80 | ((c >> 6) & 0x3F)
                buf[k + 2] = 0x80 | (c & 0x3F)
                k += 3
            else:
                buf[k] = 0xF0 | (c >> 18)
                buf[k + 1] = 0x80 | ((c >> 12) & 0x3F)
                buf[k + 2] = 0x80 | ((c >> 6) & 0x3F)
                buf[k + 3] = 0x80 | (c & 0x3F)
                k += 4
        out[i] = _hash64(buf, k)
    return out


@njit(cache=True)
def _fp_decimal(values):
    """Fingerprint64 of each int64's decimal string (``tf.strings.as_string``)."""
    buf = np.zeros(24, np.uint8)
    tmp = np.zeros(24, np.uint8)
    out = np.empty(values.shape[0], np.uint64)
    for i in range(values.shape[0]):
        v = values[i]
        neg = v < 0
        mag = np.uint64(-(v + 1)) + np.uint64(1) if neg else np.uint64(v)
        k = 0
        while True:
            tmp[k] = 48 + np.uint8(mag % np.uint64(10))
            mag //= np.uint64(10)
            k += 1
            if mag == 0:
                break
        n = 0
        if neg:
            buf[0] = 45  # '-'
            n = 1
        for j in range(k):
            buf[n + j] = tmp[k - 1 - j]
        out[i] = _hash64(buf, n + k)
    return out


def fingerprint64(values: np.ndarray) -> np.ndarray:
    """TensorFlow's ``Fingerprint64`` of each value (uint64): strings by their UTF-8 bytes,
    bytes as they are, integers (and integral floats) by their decimal string."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind in "iub":
        return _fp_decimal(arr.astype(np.int64))
    if kind == "f":
        if not np.all(np.isfinite(arr) & (arr == np.round(arr))):
            raise InvalidInputError("only strings and integers can be hashed; got "
                                    "non-integral numbers")
        return _fp_decimal(arr.astype(np.int64))
    if kind == "O":
        if len(arr) and all(isinstance(v, (bytes, np.bytes_)) for v in arr):
            arr = arr.astype(bytes)
            kind = "S"
        else:
            arr = arr.astype(str)
            kind = "U"
    if len(arr) == 0:
        return np.empty(0, np.uint64)
    if kind == "U":
        width = max(arr.dtype.itemsize // 4, 1)
        codes = np.ascontiguousarray(arr).view(np.uint32).reshape(len(arr), -1)
        if codes.shape[1] != width:
            codes = np.zeros((len(arr), 1), np.uint32)
        return _fp_unicode(codes)
    if kind == "S":
        width = arr.dtype.itemsize
        if width == 0:
            return _fp_bytes(np.zeros((len(arr), 8), np.uint8), np.zeros(len(arr), np.int64))
        raw = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8).reshape(len(arr),
                                                                                   width)
        lengths = np.char.str_len(arr).astype(np.int64)
        padded = np.zeros((len(arr), width + 8), np.uint8)  # Fetch64 never reads past len
        padded[:, :width] = raw
        return _fp_bytes(padded, lengths)
    raise InvalidInputError(f"only strings and integers can be hashed; got dtype {arr.dtype}")


def fingerprint_cat64(fp1: np.ndarray, fp2: np.ndarray) -> np.ndarray:
    """``FingerprintCat64(fp1, fp2)`` elementwise (uint64 arrays or scalars)."""
    with np.errstate(over="ignore"):
        a = np.asarray(fp1, np.uint64)
        b = np.asarray(fp2, np.uint64)
        result = a ^ _KMUL
        t = b * _KMUL
        result = result ^ ((t ^ (t >> np.uint64(47))) * _KMUL)
        result = result * _KMUL
        result = (result ^ (result >> np.uint64(47))) * _KMUL
        return result ^ (result >> np.uint64(47))


def cross_feature(values: np.ndarray) -> np.ndarray:
    """What ``sparse_cross_hashed`` feeds ``FingerprintCat64`` for one input's values: the
    Fingerprint64 of strings, the int64 value (as uint64) of integers."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64).view(np.uint64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr) & (arr == np.round(arr))):
            raise InvalidInputError("crossed_column inputs must be strings or integers; got "
                                    "non-integral numbers")
        return arr.astype(np.int64).view(np.uint64)
    return fingerprint64(arr)


__all__ = ["DEFAULT_HASH_KEY", "cross_feature", "fingerprint64", "fingerprint_cat64"]
