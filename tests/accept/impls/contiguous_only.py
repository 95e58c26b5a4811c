"""Wrong: reads q, k, v as dense arrays from their storage's start, as a kernel that takes
data_ptr() and assumes contiguous strides does. Right for contiguous tensors at offset 0; wrong
for transposed views, a storage offset, or views of a packed qkv tensor (issue 17)."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, contiguous_only=True, **kw)
