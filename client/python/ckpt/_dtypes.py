"""proto/ckpt.proto's DType values by name: shared by the binding
(ckpt.client) and the standalone reader (ckpt.format), which needs no
libckpt."""
DTYPES = {"f32": 1, "f16": 2, "bf16": 3, "f64": 4, "i8": 5, "u8": 6, "i16": 7, "i32": 8, "i64": 9,
          "bool": 10, "f8e4m3": 11, "f8e5m2": 12}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
