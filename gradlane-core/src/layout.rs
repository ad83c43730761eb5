//! The model's gradient tensors and how they are cut into chunks.
//!
//! A [`Layout`] is the ordered list of a model's gradient tensors; a
//! [`ChunkPlan`] cuts every tensor into chunks, the unit that is scored and
//! classed. Tensor `i` of the layout has id `i`; chunk ids run over the whole
//! layout, tensor by tensor, so one `u32` names a chunk and the chunks of a
//! tensor are a contiguous id range (what the wire header's first/last chunk
//! fields carry).
//!
//! Convolution weights `[out, in, kh, kw]` are cut per kernel — the `in*kh*kw`
//! values of one output channel — because a kernel is the natural unit of
//! importance in a CNN (CN110958187B, step S12; docs/DESIGN.md §2.1). Everything else is cut into fixed blocks
//! of `block_values` values, 256 by default so that one block plus its header
//! fits a single datagram at QUIC's 1200-byte minimum.

use thiserror::Error;

/// The largest tensor the wire format can address: its byte size travels as a
/// `u32`.
pub const MAX_TENSOR_BYTES: u64 = u32::MAX as u64;

/// How a tensor is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// A 2-d convolution weight of shape `[out, in, kh, kw]`.
    Conv2d,
    /// Any other tensor (dense weights, biases, batch-norm vectors), cut into
    /// fixed blocks.
    Dense,
}

/// One gradient tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// A human-readable name, unique within the layout (e.g. `layer1.0.conv1.weight`).
    pub name: String,
    /// The shape; the number of values is the product of its dimensions.
    pub shape: Vec<usize>,
    /// How the tensor is chunked.
    pub kind: TensorKind,
}

impl TensorSpec {
    /// A convolution weight `[out, in, kh, kw]`, chunked per output channel's kernel.
    pub fn conv2d(name: impl Into<String>, shape: [usize; 4]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
            kind: TensorKind::Conv2d,
        }
    }

    /// A tensor of any shape, chunked into fixed blocks.
    pub fn dense(name: impl Into<String>, shape: impl Into<Vec<usize>>) -> Self {
        Self {
            name: name.into(),
            shape: shape.into(),
            kind: TensorKind::Dense,
        }
    }

    /// The number of `f32` values, or `None` if the product overflows.
    pub fn checked_len(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }
}

/// Why a layout was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// A layout needs at least one tensor.
    #[error("layout has no tensors")]
    Empty,
    /// More tensors than a `u32` id can name.
    #[error("layout has {0} tensors, more than a u32 id can name")]
    TooManyTensors(usize),
    /// A tensor with no values (an empty shape dimension).
    #[error("tensor {index} ({name}) has a zero-sized dimension in shape {shape:?}")]
    ZeroSized {
        /// Position in the layout.
        index: usize,
        /// Its name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A tensor whose byte size does not fit the wire format.
    #[error("tensor {index} ({name}) is larger than {MAX_TENSOR_BYTES} bytes")]
    TooLarge {
        /// Position in the layout.
        index: usize,
        /// Its name.
        name: String,
    },
    /// A conv2d tensor whose shape is not 4-d.
    #[error("tensor {index} ({name}) is conv2d but has shape {shape:?}, not [out, in, kh, kw]")]
    BadConvShape {
        /// Position in the layout.
        index: usize,
        /// Its name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Two tensors share a name.
    #[error("tensor name {0:?} appears twice")]
    DuplicateName(String),
    /// The whole model has more chunks than a `u32` id can name.
    #[error("the plan has more chunks than a u32 id can name")]
    TooManyChunks,
    /// `block_values` must be at least 1.
    #[error("block_values must be at least 1")]
    ZeroBlock,
    /// The plan's chunk table could not be allocated (a layout and
    /// chunking a peer announced may ask for more than the machine has).
    #[error("a plan of {chunks} chunks does not fit in memory")]
    OutOfMemory {
        /// The chunks the plan would hold.
        chunks: u64,
    },
}

/// The ordered list of a model's gradient tensors, validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    tensors: Vec<TensorSpec>,
    /// Value offset of each tensor in the concatenation of all tensors, plus
    /// the total at the end.
    offsets: Vec<u64>,
}

impl Layout {
    /// Validates the tensors: non-empty, unique names, no zero-sized or
    /// oversized tensor, conv2d shapes 4-d.
    pub fn new(tensors: Vec<TensorSpec>) -> Result<Self, LayoutError> {
        if tensors.is_empty() {
            return Err(LayoutError::Empty);
        }
        if u32::try_from(tensors.len()).is_err() {
            return Err(LayoutError::TooManyTensors(tensors.len()));
        }
        let mut names = std::collections::HashSet::with_capacity(tensors.len());
        let mut offsets = Vec::with_capacity(tensors.len() + 1);
        let mut total = 0u64;
        for (index, t) in tensors.iter().enumerate() {
            if !names.insert(t.name.as_str()) {
                return Err(LayoutError::DuplicateName(t.name.clone()));
            }
            if t.kind == TensorKind::Conv2d && t.shape.len() != 4 {
                return Err(LayoutError::BadConvShape {
                    index,
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                });
            }
            let too_large = || LayoutError::TooLarge {
                index,
                name: t.name.clone(),
            };
            let len = t.checked_len().ok_or_else(too_large)?;
            if len == 0 {
                return Err(LayoutError::ZeroSized {
                    index,
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                });
            }
            if (len as u64).saturating_mul(4) > MAX_TENSOR_BYTES {
                return Err(too_large());
            }
            offsets.push(total);
            total += len as u64;
        }
        offsets.push(total);
        Ok(Self { tensors, offsets })
    }

    /// The tensors, in order; tensor `i` has id `i`.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Always false: a layout has at least one tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The number of values in tensor `id`.
    pub fn tensor_len(&self, id: usize) -> usize {
        (self.offsets[id + 1] - self.offsets[id]) as usize
    }

    /// The offset of tensor `id`'s first value in the concatenation of all tensors.
    pub fn value_offset(&self, id: usize) -> u64 {
        self.offsets[id]
    }

    /// Total number of values of the model.
    pub fn total_values(&self) -> u64 {
        self.offsets[self.tensors.len()]
    }

    /// Total bytes of one round (4 per value).
    pub fn total_bytes(&self) -> u64 {
        self.total_values() * 4
    }

    /// Cuts every tensor into chunks.
    pub fn plan(&self, options: ChunkOptions) -> Result<ChunkPlan, LayoutError> {
        ChunkPlan::new(self, options)
    }
}

/// How convolution weights are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConvChunking {
    /// One chunk per output channel: `in*kh*kw` values (the default).
    #[default]
    PerKernel,
    /// One chunk per `kh*kw` slice: `out*in` chunks.
    PerSlice,
}

/// Options of the chunk plan. Both ends of a link must use the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkOptions {
    /// Values per chunk for non-convolution tensors (default 256 = 1 KiB).
    pub block_values: u32,
    /// How convolution weights are cut.
    pub conv: ConvChunking,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self {
            block_values: 256,
            conv: ConvChunking::PerKernel,
        }
    }
}

/// One chunk: a contiguous run of values of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// The tensor it belongs to.
    pub tensor: u32,
    /// First value, as an index into the tensor.
    pub start: u32,
    /// Number of values.
    pub len: u32,
}

impl Chunk {
    /// Byte position of the chunk in its tensor.
    pub fn byte_start(&self) -> u32 {
        self.start * 4
    }

    /// Byte length of the chunk.
    pub fn byte_len(&self) -> u32 {
        self.len * 4
    }
}

/// Every chunk of a layout, in tensor order; a chunk's index is its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    options: ChunkOptions,
    chunks: Vec<Chunk>,
    /// For each tensor, its first chunk id; plus the total at the end.
    tensor_first: Vec<u32>,
    /// For each tensor, its byte size.
    tensor_bytes: Vec<u32>,
    /// For each tensor, the values of each of its chunks but the last
    /// (which may be shorter): chunks are found by division, not search.
    tensor_step: Vec<u32>,
}

impl ChunkPlan {
    fn new(layout: &Layout, options: ChunkOptions) -> Result<Self, LayoutError> {
        if options.block_values == 0 {
            return Err(LayoutError::ZeroBlock);
        }
        let mut tensor_first = Vec::with_capacity(layout.len() + 1);
        let mut tensor_bytes = Vec::with_capacity(layout.len());
        let mut tensor_step = Vec::with_capacity(layout.len());
        for (id, spec) in layout.tensors().iter().enumerate() {
            let len = layout.tensor_len(id) as u32; // < 2^30, checked by Layout::new
            tensor_bytes.push(len * 4);
            tensor_step.push(match spec.kind {
                TensorKind::Conv2d => match options.conv {
                    ConvChunking::PerKernel => {
                        (spec.shape[1] * spec.shape[2] * spec.shape[3]) as u32
                    }
                    ConvChunking::PerSlice => (spec.shape[2] * spec.shape[3]) as u32,
                },
                TensorKind::Dense => options.block_values,
            });
        }
        // Counted before anything is allocated: a layout from a peer's
        // hello may ask for billions of chunks in a few bytes, and a table
        // that size must be refused, not attempted.
        let count: u64 = tensor_bytes
            .iter()
            .zip(&tensor_step)
            .map(|(&bytes, &step)| (bytes as u64 / 4).div_ceil(step.max(1) as u64))
            .sum();
        if count > u32::MAX as u64 {
            return Err(LayoutError::TooManyChunks);
        }
        let mut chunks = Vec::new();
        chunks
            .try_reserve_exact(count as usize)
            .map_err(|_| LayoutError::OutOfMemory { chunks: count })?;
        for (id, (&bytes, &step)) in tensor_bytes.iter().zip(&tensor_step).enumerate() {
            tensor_first.push(chunks.len() as u32);
            let len = bytes / 4;
            let mut start = 0u32;
            while start < len {
                let n = step.min(len - start);
                chunks.push(Chunk {
                    tensor: id as u32,
                    start,
                    len: n,
                });
                start += n;
            }
        }
        let total = u32::try_from(chunks.len()).map_err(|_| LayoutError::TooManyChunks)?;
        tensor_first.push(total);
        Ok(Self {
            options,
            chunks,
            tensor_first,
            tensor_bytes,
            tensor_step,
        })
    }

    /// The options the plan was made with.
    pub fn options(&self) -> ChunkOptions {
        self.options
    }

    /// All chunks; chunk id = index.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// True when the plan has no chunks (never, for a valid layout).
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensor_bytes.len()
    }

    /// The chunk ids of tensor `id`, as a half-open range.
    pub fn tensor_chunks(&self, id: usize) -> std::ops::Range<usize> {
        self.tensor_first[id] as usize..self.tensor_first[id + 1] as usize
    }

    /// Byte size of tensor `id`.
    pub fn tensor_bytes(&self, id: usize) -> u32 {
        self.tensor_bytes[id]
    }

    /// Which chunk of tensor `tensor` holds the byte at `byte`, if any.
    ///
    /// Called for every received piece (about a packet), so it divides by
    /// the tensor's chunk step instead of searching.
    pub fn chunk_at(&self, tensor: usize, byte: u32) -> Option<usize> {
        let step = *self.tensor_step.get(tensor)?;
        let range = self.tensor_chunks(tensor);
        if step == 0 || byte >= self.tensor_bytes[tensor] {
            return None;
        }
        let id = range.start + (byte / 4 / step) as usize;
        (id < range.end).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan of more chunks than ids is refused before its table is
    /// allocated (five tensors of a billion values in blocks of one would
    /// be 60 GB): a peer's hello of a few bytes can ask for it.
    #[test]
    fn too_many_chunks_are_refused_before_allocation() {
        let tensors = (0..5)
            .map(|i| TensorSpec::dense(format!("t{i}"), [1_000_000_000]))
            .collect();
        let layout = Layout::new(tensors).unwrap();
        let one = ChunkOptions {
            block_values: 1,
            ..Default::default()
        };
        assert_eq!(layout.plan(one), Err(LayoutError::TooManyChunks));
    }

    #[test]
    fn conv_chunks_are_kernels() {
        let layout = Layout::new(vec![TensorSpec::conv2d("c", [4, 3, 2, 2])]).unwrap();
        let plan = layout.plan(ChunkOptions::default()).unwrap();
        assert_eq!(plan.len(), 4);
        assert!(plan.chunks().iter().all(|c| c.len == 12));
        let plan = layout
            .plan(ChunkOptions {
                conv: ConvChunking::PerSlice,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(plan.len(), 12);
    }

    #[test]
    fn chunk_at_finds_the_holder() {
        let layout = Layout::new(vec![
            TensorSpec::dense("a", [10]),
            TensorSpec::dense("b", [600]),
        ])
        .unwrap();
        let plan = layout.plan(ChunkOptions::default()).unwrap();
        assert_eq!(plan.chunk_at(0, 0), Some(0));
        assert_eq!(plan.chunk_at(0, 39), Some(0));
        assert_eq!(plan.chunk_at(0, 40), None);
        assert_eq!(plan.chunk_at(1, 0), Some(1));
        assert_eq!(plan.chunk_at(1, 256 * 4), Some(2));
        assert_eq!(plan.chunk_at(1, 599 * 4), Some(3));
        assert_eq!(plan.chunk_at(1, 600 * 4), None);
        assert_eq!(plan.chunk_at(2, 0), None);
    }

    #[test]
    fn chunk_at_agrees_with_the_chunk_list() {
        // Steps that divide and that leave a short last chunk, per kernel
        // and per slice.
        let layout = Layout::new(vec![
            TensorSpec::conv2d("c", [5, 3, 3, 3]),
            TensorSpec::dense("d", [1000]),
            TensorSpec::dense("e", [512]),
            TensorSpec::conv2d("p", [2, 4, 1, 1]),
        ])
        .unwrap();
        for conv in [ConvChunking::PerKernel, ConvChunking::PerSlice] {
            let options = ChunkOptions {
                block_values: 300,
                conv,
            };
            let plan = layout.plan(options).unwrap();
            for (id, c) in plan.chunks().iter().enumerate() {
                for v in c.start..c.start + c.len {
                    for b in 0..4 {
                        assert_eq!(plan.chunk_at(c.tensor as usize, v * 4 + b), Some(id));
                    }
                }
            }
        }
    }

    #[test]
    fn bad_layouts_are_named() {
        assert_eq!(Layout::new(vec![]), Err(LayoutError::Empty));
        assert!(matches!(
            Layout::new(vec![TensorSpec::dense("z", [3, 0])]),
            Err(LayoutError::ZeroSized { .. })
        ));
        assert!(matches!(
            Layout::new(vec![
                TensorSpec::dense("a", [1]),
                TensorSpec::dense("a", [2])
            ]),
            Err(LayoutError::DuplicateName(_))
        ));
        assert!(matches!(
            Layout::new(vec![TensorSpec::dense("huge", [1 << 31])]),
            Err(LayoutError::TooLarge { .. })
        ));
        let conv3 = TensorSpec {
            name: "c".into(),
            shape: vec![1, 2, 3],
            kind: TensorKind::Conv2d,
        };
        assert!(matches!(
            Layout::new(vec![conv3]),
            Err(LayoutError::BadConvShape { .. })
        ));
    }
}
