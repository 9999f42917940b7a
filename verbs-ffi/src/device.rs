//! The device list: which RDMA devices libibverbs sees, and opening one.
//!
//! Unsafe because it reads the C device array returned by `ibv_get_device_list` and calls
//! libibverbs through function pointers; the list is owned here and freed exactly once.
#![allow(unsafe_code)]

use core::ffi::{CStr, c_int};
use core::marker::PhantomData;
use core::ptr::NonNull;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{VerbsError, errno_after_null};
use crate::loader::{Verbs, verbs};
use crate::sys::ibv_device;

/// The devices libibverbs found (`ibv_get_device_list`), freed on drop.
///
/// Contexts opened from it stay valid after the list is dropped (libibverbs keeps a reference on
/// each opened device).
#[derive(Debug)]
pub struct DeviceList {
    verbs: &'static Verbs,
    list: NonNull<*mut ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers owned by this value; libibverbs device
// objects may be used from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: as above; no method mutates the array.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// Loads libibverbs if needed and lists the devices. An empty list is `Ok`.
    pub fn new() -> Result<Self, VerbsError> {
        let verbs = verbs()?;
        let mut count: c_int = 0;
        // SAFETY: count is a valid out-pointer; the function returns NULL (errno set) or a
        // NULL-terminated array of `count` devices that we free in Drop.
        let raw = unsafe { (verbs.get_device_list)(&mut count) };
        let list = NonNull::new(raw).ok_or(VerbsError::Call {
            call: "ibv_get_device_list",
            errno: errno_after_null(),
        })?;
        let len = usize::try_from(count).unwrap_or(0);
        Ok(Self { verbs, list, len })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no device was found.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device at `index`.
    pub fn get(&self, index: usize) -> Option<Device<'_>> {
        if index >= self.len {
            return None;
        }
        // SAFETY: index < len, and the array holds len valid entries.
        let raw = unsafe { *self.list.as_ptr().add(index) };
        NonNull::new(raw).map(|ptr| Device {
            verbs: self.verbs,
            ptr,
            _list: PhantomData,
        })
    }

    /// All devices, in libibverbs' order.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(|i| self.get(i))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from ibv_get_device_list and is freed only here.
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) };
    }
}

/// One entry of a [`DeviceList`].
#[derive(Debug, Clone, Copy)]
pub struct Device<'list> {
    verbs: &'static Verbs,
    ptr: NonNull<ibv_device>,
    _list: PhantomData<&'list DeviceList>,
}

impl<'list> Device<'list> {
    /// Kernel device name, e.g. `mlx5_0` or `rxe0`.
    pub fn name(&self) -> String {
        // SAFETY: the device is alive while the list is borrowed; the function returns a pointer to the
        // NUL-terminated name inside it (or NULL).
        let name = unsafe { (self.verbs.get_device_name)(self.ptr.as_ptr()) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, lives as long as the device.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Node GUID as the library returns it (a `__be64`: big-endian bytes in a `u64`).
    pub fn guid(&self) -> u64 {
        // SAFETY: live device pointer.
        unsafe { (self.verbs.get_device_guid)(self.ptr.as_ptr()) }
    }

    /// The device's sysfs directory as libibverbs found it (`ibdev_path`, e.g.
    /// `/sys/class/infiniband/mlx5_0`); `None` when the field is empty. A user-space provider
    /// points it at a tree of its own, which is why discovery reads sysfs through it.
    pub fn ibdev_path(&self) -> Option<PathBuf> {
        // SAFETY: the device is alive while the list is borrowed; `ibdev_path` is a public
        // `char[IBV_SYSFS_PATH_MAX]` field of `struct ibv_device` (layout checked in `sys`), and
        // only a shared view of it is taken.
        let field = unsafe { &(*self.ptr.as_ptr()).ibdev_path };
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c.to_ne_bytes()[0])
            .collect();
        (!bytes.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(&bytes)))
    }

    /// The raw pointer, for mlx5dv calls such as `mlx5dv_is_supported`.
    pub fn as_ptr(&self) -> *mut ibv_device {
        self.ptr.as_ptr()
    }

    /// Opens the device (`ibv_open_device`), with its async-event fd set non-blocking.
    pub fn open(&self) -> Result<Arc<Context>, VerbsError> {
        Context::open(self.verbs, self.ptr, self.name())
    }
}
