//! One named array as the data formats read it: its element type and its values.

/// An element type an array may hold, as both formats spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// 64-bit float (read as f32).
    F64,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit signed integer.
    I64,
    /// 64-bit unsigned integer.
    U64,
}

impl Dtype {
    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::I16 | Dtype::U16 => 2,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// The name NumPy gives it, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::U16 => "uint16",
            Dtype::I32 => "int32",
            Dtype::U32 => "uint32",
            Dtype::I64 => "int64",
            Dtype::U64 => "uint64",
        }
    }

    pub(crate) fn from_safetensors(d: safetensors::Dtype) -> Option<Dtype> {
        use safetensors::Dtype as S;
        Some(match d {
            S::F32 => Dtype::F32,
            S::F64 => Dtype::F64,
            S::U8 => Dtype::U8,
            S::I8 => Dtype::I8,
            S::I16 => Dtype::I16,
            S::U16 => Dtype::U16,
            S::I32 => Dtype::I32,
            S::U32 => Dtype::U32,
            S::I64 => Dtype::I64,
            S::U64 => Dtype::U64,
            _ => return None,
        })
    }
}

/// One array as read from a file: its element type, shape and little-endian bytes (C order).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `product(shape) × dtype.width()` bytes.
    pub data: Vec<u8>,
}

impl Array {
    /// A borrowed view of the array, as a safetensors file gives its tensors without copying them.
    pub fn view(&self) -> ArrayRef<'_> {
        ArrayRef { dtype: self.dtype, shape: self.shape.clone(), data: &self.data }
    }
}

/// An array's element type, shape and bytes, borrowed from wherever they were read into.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayRef<'a> {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `product(shape) × dtype.width()` bytes.
    pub data: &'a [u8],
}
