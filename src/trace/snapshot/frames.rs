//! Interned stacks. A snapshot repeats the same frames and the same stacks
//! thousands of times; each distinct frame and each distinct stack is stored
//! once and named by a small id.

use rustc_hash::FxHashMap;

use crate::trace::pickle::SharedStr;

/// One stack frame, `{filename, line, name}` in the file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: SharedStr,
    pub line: i64,
    pub name: SharedStr,
}

/// What a frame is, for reading a stack: the user's own code, or one of the
/// layers that run under (and around) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// The user's own Python code: the line a person can change.
    User,
    /// C++ or CUDA (`??`, `""`, `*.cpp`, `*.cu`, `*.h`, ...).
    Native,
    /// torch's own Python (`.../torch/...`).
    Torch,
    /// Interpreter pseudo-files such as `<frozen runpy>` or `<eval_with_key>`.
    Interpreter,
}

impl Frame {
    /// Which layer the frame belongs to, by its file name alone.
    pub fn kind(&self) -> FrameKind {
        let f = &*self.filename;
        if f.is_empty() || f == "??" {
            return FrameKind::Native;
        }
        if f.starts_with('<') {
            return FrameKind::Interpreter;
        }
        const NATIVE: [&str; 7] = [".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp", ".c"];
        if NATIVE.iter().any(|ext| f.ends_with(ext)) {
            return FrameKind::Native;
        }
        if f.contains("/torch/") || f.contains("\\torch\\") || f.contains("site-packages/torch") {
            return FrameKind::Torch;
        }
        FrameKind::User
    }

    /// True for the user's own Python code: not C++ (`??`, `""`, `*.cpp`,
    /// `*.cu`, `*.h`), not torch itself, not interpreter pseudo-files such as
    /// `<frozen runpy>` or `<eval_with_key>`.
    pub fn is_user_code(&self) -> bool {
        self.kind() == FrameKind::User
    }

    /// True where a model's weights are put on the device, which the
    /// driver-address model takes as coming before the program's first
    /// kernel (docs/driver_addresses.md): `torch.nn.Module._apply` (a
    /// module's `.to()` / `.cuda()` / `.half()`, which copies or casts its
    /// tensors), and transformers 5.x's `from_pretrained`, whose
    /// `caching_allocator_warmup` takes one `torch.empty` block
    /// (modeling_utils.py:5136) and whose `_materialize_copy` copies each
    /// checkpoint tensor to the device (core_model_loading.py:1236-1241: a
    /// host-to-device copy, a `cudaMemcpyAsync`, no kernel). The first
    /// kernel of a bitsandbytes model's loading is its first weight's
    /// quantisation (`quantize_4bit`'s CUDA op, bitsandbytes 0.50.2
    /// backends/cuda/ops.py:384-418), whose requests are under neither.
    pub fn is_module_conversion(&self) -> bool {
        is_module_conversion(&self.filename, &self.name)
    }
}

/// The functions [`is_module_conversion`] names: (function, its file with
/// either separator).
const CONVERSIONS: [(&str, &str, &str); 3] = [
    (
        "_apply",
        "torch/nn/modules/module.py",
        "torch\\nn\\modules\\module.py",
    ),
    (
        "caching_allocator_warmup",
        "transformers/modeling_utils.py",
        "transformers\\modeling_utils.py",
    ),
    (
        "_materialize_copy",
        "transformers/core_model_loading.py",
        "transformers\\core_model_loading.py",
    ),
];

/// [`Frame::is_module_conversion`] of a frame given by file and function name.
pub fn is_module_conversion(filename: &str, name: &str) -> bool {
    CONVERSIONS.iter().any(|(f, unix, windows)| {
        name == *f && (filename.ends_with(unix) || filename.ends_with(windows))
    })
}

/// Index of one distinct [`Frame`] in a [`FrameTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// Index of one distinct stack in a [`FrameTable`]. [`FramesId::EMPTY`] is
/// the empty stack; equal stacks always get the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FramesId(pub u32);

impl FramesId {
    pub const EMPTY: FramesId = FramesId(0);
}

/// Distinct frames and distinct stacks (innermost frame first).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameTable {
    frames: Vec<Frame>,
    /// `(start, len)` into `items`, per stack.
    stacks: Vec<(u32, u32)>,
    items: Vec<FrameId>,
    frame_index: FxHashMap<Frame, FrameId>,
    stack_index: FxHashMap<Box<[FrameId]>, FramesId>,
}

impl Default for FrameTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameTable {
    /// A table holding only the empty stack.
    pub fn new() -> Self {
        let mut stack_index = FxHashMap::default();
        stack_index.insert(Box::from([]), FramesId::EMPTY);
        Self {
            frames: Vec::new(),
            stacks: vec![(0, 0)],
            items: Vec::new(),
            frame_index: FxHashMap::default(),
            stack_index,
        }
    }

    /// The id of `frame`, adding it if new.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_index.get(&frame) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(frame.clone());
        self.frame_index.insert(frame, id);
        id
    }

    /// The id of the stack `ids` (innermost first), adding it if new.
    pub fn intern_stack(&mut self, ids: &[FrameId]) -> FramesId {
        if let Some(&id) = self.stack_index.get(ids) {
            return id;
        }
        let id = FramesId(self.stacks.len() as u32);
        self.stacks
            .push((self.items.len() as u32, ids.len() as u32));
        self.items.extend_from_slice(ids);
        self.stack_index.insert(ids.into(), id);
        id
    }

    /// The frames of a stack, innermost first. Unknown ids give `[]`.
    pub fn stack(&self, id: FramesId) -> &[FrameId] {
        match self.stacks.get(id.0 as usize) {
            Some(&(start, len)) => self
                .items
                .get(start as usize..(start + len) as usize)
                .unwrap_or(&[]),
            None => &[],
        }
    }

    /// One frame. Ids come from this table; a foreign id gives `None`.
    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id.0 as usize)
    }

    /// The frames of a stack, resolved, innermost first.
    pub fn resolve(&self, id: FramesId) -> impl Iterator<Item = &Frame> + '_ {
        self.stack(id).iter().filter_map(|&f| self.frame(f))
    }

    /// See [`Frame::is_user_code`].
    pub fn first_user_frame(&self, id: FramesId) -> Option<&Frame> {
        self.resolve(id).find(|f| f.is_user_code())
    }

    /// Number of distinct frames.
    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// Number of distinct stacks, the empty one included.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: i64, name: &str) -> Frame {
        Frame {
            filename: file.into(),
            line,
            name: name.into(),
        }
    }

    #[test]
    fn weights_put_on_the_device_come_before_the_first_kernel() {
        let site = "/usr/lib/python3/site-packages";
        let conv = |file: &str, name: &str| frame(&format!("{site}/{file}"), 1, name);
        assert!(conv("torch/nn/modules/module.py", "_apply").is_module_conversion());
        assert!(is_module_conversion(
            "C:\\py\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
            "_apply"
        ));
        // transformers 5.x's from_pretrained: the warm-up block and each
        // checkpoint tensor's copy to the device.
        assert!(
            conv("transformers/modeling_utils.py", "caching_allocator_warmup")
                .is_module_conversion()
        );
        assert!(
            conv("transformers/core_model_loading.py", "_materialize_copy").is_module_conversion()
        );
        // bitsandbytes' quantisation and a function of the same name
        // elsewhere launch kernels.
        assert!(!conv("bitsandbytes/backends/cuda/ops.py", "_").is_module_conversion());
        assert!(!conv("bitsandbytes/nn/modules.py", "_quantize").is_module_conversion());
        assert!(!conv("mylib/loading.py", "_materialize_copy").is_module_conversion());
        assert!(!conv("transformers/core_model_loading.py", "_apply").is_module_conversion());
    }

    #[test]
    fn equal_stacks_share_an_id() {
        let mut t = FrameTable::new();
        let a = t.intern_frame(frame("/a.py", 1, "f"));
        let b = t.intern_frame(frame("/b.py", 2, "g"));
        assert_eq!(t.intern_frame(frame("/a.py", 1, "f")), a);
        let s1 = t.intern_stack(&[a, b]);
        let s2 = t.intern_stack(&[a, b]);
        assert_eq!(s1, s2);
        assert_ne!(t.intern_stack(&[b, a]), s1);
        assert_eq!(t.intern_stack(&[]), FramesId::EMPTY);
        assert_eq!(t.stack(s1), &[a, b]);
        assert_eq!(t.stack_count(), 3);
    }

    #[test]
    fn user_frames_skip_native_torch_and_frozen() {
        let mut t = FrameTable::new();
        let ids: Vec<_> = [
            frame("??", 0, "torch::unwind::unwind()"),
            frame("", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame("python_variable.cpp", 0, "THPVariable_new"),
            frame(
                "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("C:\\venv\\Lib\\torch\\nn\\functional.py", 10, "relu"),
            frame("<frozen runpy>", 88, "_run_code"),
            frame("/home/me/train.py", 42, "step"),
            frame("/home/me/main.py", 7, "<module>"),
        ]
        .into_iter()
        .map(|f| t.intern_frame(f))
        .collect();
        let s = t.intern_stack(&ids);
        let kinds: Vec<FrameKind> = t.resolve(s).map(Frame::kind).collect();
        use FrameKind::*;
        assert_eq!(
            kinds,
            [
                Native,
                Native,
                Native,
                Torch,
                Torch,
                Interpreter,
                User,
                User
            ]
        );
        let user = t.first_user_frame(s).map(|f| (&*f.filename, f.line));
        assert_eq!(user, Some(("/home/me/train.py", 42)));
        assert_eq!(t.first_user_frame(FramesId::EMPTY), None);
    }
}
