//! The functions of libtorch's stable C shim (`torch/csrc/inductor/aoti_torch/c/shim.h` and
//! `torch/csrc/stable/c/shim.h`, torch 2.10 and later) that the native kernels call, resolved
//! at run time from the libraries the imported torch has loaded: the wheel links no torch, so
//! one build serves every torch that has them.
use std::ffi::{c_char, c_void};
use std::path::Path;

use libc::{RTLD_NOLOAD, RTLD_NOW};
use libloading::os::unix::Library;

/// `AtenTensorHandle`: an owned `at::Tensor*` (the kernels delete what they are handed).
pub type TensorHandle = *mut c_void;
/// `StringHandle` (torch 2.10).
type StringHandle = *mut c_void;
/// `TorchLibraryHandle`.
pub type LibraryHandle = *mut c_void;
/// `AOTITorchError`: 0 is success.
type Status = i32;
/// A boxed kernel: the stack of `StableIValue`s, the number of arguments, of returns.
pub type BoxedKernel = unsafe extern "C-unwind" fn(*mut u64, u64, u64);

/// `c10::ScalarType::Float8_e8m0fnu`, which the shim has no function for. The enum's values
/// are fixed: they are serialized in saved models and only ever appended to.
const FLOAT8_E8M0FNU: i32 = 44;

/// The shim's dtype and device codes the checks compare with.
pub struct Codes {
    pub uint8: i32,
    pub int64: i32,
    pub bfloat16: i32,
    pub float8_e4m3fn: i32,
    pub float8_e8m0fnu: i32,
    pub cpu: i32,
    pub cuda: i32,
}

/// Frees the heap box an optional argument's value arrives in.
enum BoxFree {
    /// `torch_delete_stable_ivalue` (newer torch).
    Stable(unsafe extern "C" fn(*mut u64) -> Status),
    /// C++ `operator delete(void*)`: torch 2.10 and 2.11 box with `new StableIValue`.
    Delete(unsafe extern "C" fn(*mut c_void)),
}

macro_rules! shim_functions {
    ($($field:ident: $symbol:literal => fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The shim functions, resolved once.
        pub struct Shim {
            $(pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            pub codes: Codes,
            box_free: BoxFree,
            /// The libraries resolved from, kept open with them.
            _libraries: Vec<Library>,
        }

        impl Shim {
            fn resolve(cpu: &Library, cuda: &Library, cxx: &Library) -> Result<Shim, String> {
                $(let $field = symbol(&[cpu, cuda], $symbol)?;)*
                let codes = codes(cpu)?;
                let box_free = match symbol(&[cpu], "torch_delete_stable_ivalue") {
                    Ok(f) => BoxFree::Stable(f),
                    Err(_) => BoxFree::Delete(symbol(&[cxx], "_ZdlPv")?),
                };
                Ok(Shim { $($field,)* codes, box_free, _libraries: Vec::new() })
            }
        }
    };
}

shim_functions! {
    data_ptr: "aoti_torch_get_data_ptr" => fn(TensorHandle, *mut *mut c_void) -> Status;
    dim: "aoti_torch_get_dim" => fn(TensorHandle, *mut i64) -> Status;
    sizes: "aoti_torch_get_sizes" => fn(TensorHandle, *mut *const i64) -> Status;
    is_contiguous: "aoti_torch_is_contiguous" => fn(TensorHandle, *mut bool) -> Status;
    dtype: "aoti_torch_get_dtype" => fn(TensorHandle, *mut i32) -> Status;
    device_type: "aoti_torch_get_device_type" => fn(TensorHandle, *mut i32) -> Status;
    device_index: "aoti_torch_get_device_index" => fn(TensorHandle, *mut i32) -> Status;
    delete_tensor: "aoti_torch_delete_tensor_object" => fn(TensorHandle) -> Status;
    empty_strided: "aoti_torch_empty_strided" =>
        fn(i64, *const i64, *const i64, i32, i32, i32, *mut TensorHandle) -> Status;
    element_size: "aoti_torch_dtype_element_size" => fn(i32) -> usize;
    current_stream: "aoti_torch_get_current_cuda_stream" => fn(i32, *mut *mut c_void) -> Status;
    string_length: "torch_string_length" => fn(StringHandle, *mut usize) -> Status;
    string_data: "torch_string_c_str" => fn(StringHandle, *mut *const c_char) -> Status;
    delete_string: "torch_delete_string" => fn(StringHandle) -> Status;
    library_init_impl: "aoti_torch_library_init_impl" =>
        fn(*const c_char, *const c_char, *const c_char, u32, *mut LibraryHandle) -> Status;
    library_impl: "torch_library_impl" =>
        fn(LibraryHandle, *const c_char, BoxedKernel, u64) -> Status;
}

/// The first of `libraries` that has `name`.
fn symbol<T: Copy>(libraries: &[&Library], name: &str) -> Result<T, String> {
    let mut zero_ended = name.as_bytes().to_vec();
    zero_ended.push(0);
    for library in libraries {
        // SAFETY: `T` is the function type shim.h declares for `name` (the table above); the
        // library stays open in the `Shim` the pointer is kept in.
        if let Ok(found) = unsafe { library.get::<T>(zero_ended.as_slice()) } {
            return Ok(*found);
        }
    }
    Err(format!("libtorch has no `{name}`"))
}

fn codes(cpu: &Library) -> Result<Codes, String> {
    let code = |name: &str| -> Result<i32, String> {
        let f: unsafe extern "C" fn() -> i32 = symbol(&[cpu], name)?;
        // SAFETY: the shim's code getters take nothing and return a constant.
        Ok(unsafe { f() })
    };
    Ok(Codes {
        uint8: code("aoti_torch_dtype_uint8")?,
        int64: code("aoti_torch_dtype_int64")?,
        bfloat16: code("aoti_torch_dtype_bfloat16")?,
        float8_e4m3fn: code("aoti_torch_dtype_float8_e4m3fn")?,
        float8_e8m0fnu: FLOAT8_E8M0FNU,
        cpu: code("aoti_torch_device_type_cpu")?,
        cuda: code("aoti_torch_device_type_cuda")?,
    })
}

/// An already loaded library (RTLD_NOLOAD: never loads a second copy).
pub fn loaded(path: &Path) -> Result<Library, String> {
    // SAFETY: RTLD_NOLOAD only returns a handle to a library the process has loaded (its
    // initialisers have run); nothing new is loaded.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_NOLOAD) }
        .map_err(|e| format!("{} is not loaded: {e}", path.display()))
}

impl Shim {
    /// Resolves the shim from the imported torch's libraries in `torch_lib` (its `lib`
    /// folder), and the C++ runtime it runs on.
    pub fn load(torch_lib: &Path) -> Result<Shim, String> {
        let cpu = loaded(&torch_lib.join("libtorch_cpu.so"))?;
        let cuda = loaded(&torch_lib.join("libtorch_cuda.so"))?;
        let cxx = loaded(Path::new("libstdc++.so.6"))?;
        let mut shim = Shim::resolve(&cpu, &cuda, &cxx)?;
        shim._libraries = vec![cpu, cuda, cxx];
        Ok(shim)
    }

    /// Reads a `str?` argument and frees what it arrived in (0: None).
    ///
    /// # Safety
    /// `value` is the stack entry of a `str?` argument, read once.
    pub unsafe fn take_optional_str(&self, value: u64) -> Option<String> {
        if value == 0 {
            return None;
        }
        let boxed = value as *mut u64;
        // SAFETY: a `str?` that is not None arrives as a heap box holding a StringHandle.
        let handle = unsafe { *boxed } as StringHandle;
        let (mut data, mut len): (*const c_char, usize) = (std::ptr::null(), 0);
        // SAFETY: `handle` is a live string; the calls write one pointer and one length.
        let text = unsafe {
            if (self.string_data)(handle, &mut data) != 0
                || (self.string_length)(handle, &mut len) != 0
                || data.is_null()
            {
                String::new()
            } else {
                let bytes = std::slice::from_raw_parts(data as *const u8, len);
                String::from_utf8_lossy(bytes).into_owned()
            }
        };
        // SAFETY: both are owned by this call (the kernel's argument) and freed once.
        unsafe {
            (self.delete_string)(handle);
            match self.box_free {
                BoxFree::Stable(free) => {
                    free(boxed);
                }
                BoxFree::Delete(delete) => delete(boxed as *mut c_void),
            }
        }
        Some(text)
    }

    /// The current CUDA stream of device `index` (the capture stream while capturing).
    pub fn stream(&self, index: i32) -> Result<*mut c_void, String> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        match unsafe { (self.current_stream)(index, &mut stream) } {
            0 => Ok(stream),
            _ => Err(format!("no current CUDA stream on device {index}")),
        }
    }

    /// A new contiguous 2-D tensor of `dtype` on CUDA device `index` (torch's allocator).
    pub fn empty_2d(&self, shape: [i64; 2], dtype: i32, index: i32) -> Option<Owned<'_>> {
        let strides = [shape[1], 1];
        let mut made = std::ptr::null_mut();
        // SAFETY: two sizes and two strides; writes one new handle, owned by the result.
        let status = unsafe {
            (self.empty_strided)(
                2,
                shape.as_ptr(),
                strides.as_ptr(),
                dtype,
                self.codes.cuda,
                index,
                &mut made,
            )
        };
        (status == 0 && !made.is_null()).then(|| Owned::new(self, made))
    }
}

/// A tensor handle the kernel owns: deleted when dropped, or handed on by `release`.
pub struct Owned<'a> {
    shim: &'a Shim,
    handle: TensorHandle,
}

/// The facts of a tensor the checks read.
pub struct Facts {
    pub address: u64,
    pub dim: usize,
    /// The first two sizes (0 past `dim`).
    pub sizes: [i64; 2],
    pub contiguous: bool,
    pub dtype: i32,
    pub device_type: i32,
    pub device_index: i32,
}

impl<'a> Owned<'a> {
    pub fn new(shim: &'a Shim, handle: TensorHandle) -> Self {
        Owned { shim, handle }
    }

    /// The tensor's facts (None: the shim refused one, a tensor it cannot describe).
    pub fn facts(&self) -> Option<Facts> {
        let s = self.shim;
        let h = self.handle;
        let (mut address, mut dim, mut sizes) = (std::ptr::null_mut(), 0i64, std::ptr::null());
        let (mut contiguous, mut dtype, mut device_type, mut device_index) = (false, 0, 0, 0);
        // SAFETY: `h` is a live tensor this value owns; each call writes one value, and the
        // sizes pointer it returns is borrowed from the tensor, read below while it lives.
        unsafe {
            let ok = (s.data_ptr)(h, &mut address) == 0
                && (s.dim)(h, &mut dim) == 0
                && (s.sizes)(h, &mut sizes) == 0
                && (s.is_contiguous)(h, &mut contiguous) == 0
                && (s.dtype)(h, &mut dtype) == 0
                && (s.device_type)(h, &mut device_type) == 0
                && (s.device_index)(h, &mut device_index) == 0;
            if !ok {
                return None;
            }
            let dim = dim as usize;
            let mut first = [0i64; 2];
            for (d, size) in first.iter_mut().enumerate().take(dim.min(2)) {
                *size = *sizes.add(d);
            }
            Some(Facts {
                address: address as u64,
                dim,
                sizes: first,
                contiguous,
                dtype,
                device_type,
                device_index,
            })
        }
    }

    /// Hands the handle on (to the stack, as a return), undeleted.
    pub fn release(self) -> TensorHandle {
        let handle = self.handle;
        std::mem::forget(self);
        handle
    }
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this value and deleted once.
        unsafe {
            (self.shim.delete_tensor)(self.handle);
        }
    }
}

/// `name` as a C string for the shim (names are ours, without NUL bytes).
pub fn c_name(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(name).expect("an op or namespace name has no NUL byte")
}
