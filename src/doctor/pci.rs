//! PCI facts the doctor needs, read from config space bytes and sysfs paths (pure functions).
//!
//! Config space is read from `<device>/config`; unprivileged readers get only its first 64 bytes,
//! which hold neither the capability list's PCIe capability nor any extended capability.

use std::path::{Path, PathBuf};

/// Standard capability id of the PCI Express capability.
const CAP_ID_PCIE: u8 = 0x10;
/// Extended capability id of Access Control Services.
const EXT_CAP_ID_ACS: u16 = 0x000d;
/// ACS control: P2P Request Redirect.
const ACS_CTRL_REQ_REDIRECT: u16 = 1 << 2;
/// ACS control: P2P Completion Redirect.
const ACS_CTRL_CMPLT_REDIRECT: u16 = 1 << 3;
/// PCIe Device Control: Enable Relaxed Ordering.
const DEVCTL_RELAXED_ORDERING: u16 = 1 << 4;

/// What config space says about one feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigFact<T> {
    /// Read and found.
    Known(T),
    /// The device has no such capability.
    Absent,
    /// Config space is cut short (not root): the capability cannot be looked for.
    Unreadable,
}

fn u16_at(config: &[u8], offset: usize) -> Option<u16> {
    Some(u16::from_le_bytes([
        *config.get(offset)?,
        *config.get(offset + 1)?,
    ]))
}

fn u32_at(config: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_le_bytes([
        *config.get(offset)?,
        *config.get(offset + 1)?,
        *config.get(offset + 2)?,
        *config.get(offset + 3)?,
    ]))
}

/// The ACS control register, or why there is none.
pub(crate) fn acs_control(config: &[u8]) -> ConfigFact<u16> {
    if config.len() < 0x104 {
        return ConfigFact::Unreadable;
    }
    let mut offset = 0x100usize;
    // At most 4 KiB / 4 B capability headers: bounds a looping list in hostile input.
    for _ in 0..1024 {
        let Some(header) = u32_at(config, offset) else {
            return ConfigFact::Unreadable;
        };
        if header == 0 || header == u32::MAX {
            return ConfigFact::Absent;
        }
        if header & 0xffff == u32::from(EXT_CAP_ID_ACS) {
            return u16_at(config, offset + 6).map_or(ConfigFact::Unreadable, ConfigFact::Known);
        }
        let next = (header >> 20) as usize;
        if next < 0x100 {
            return ConfigFact::Absent;
        }
        offset = next & !3;
    }
    ConfigFact::Absent
}

/// Whether ACS redirects peer-to-peer requests or completions up to the root complex.
pub(crate) fn acs_redirects(control: u16) -> bool {
    control & (ACS_CTRL_REQ_REDIRECT | ACS_CTRL_CMPLT_REDIRECT) != 0
}

/// The PCIe Device Control register's Relaxed Ordering enable bit.
pub(crate) fn relaxed_ordering(config: &[u8]) -> ConfigFact<bool> {
    // Status register bit 4: a capability list exists.
    let Some(status) = u16_at(config, 0x06) else {
        return ConfigFact::Unreadable;
    };
    if status & (1 << 4) == 0 {
        return ConfigFact::Absent;
    }
    let Some(&first) = config.get(0x34) else {
        return ConfigFact::Unreadable;
    };
    let mut offset = usize::from(first & !3);
    for _ in 0..48 {
        if offset < 0x40 {
            return ConfigFact::Absent;
        }
        let (Some(&id), Some(&next)) = (config.get(offset), config.get(offset + 1)) else {
            return ConfigFact::Unreadable;
        };
        if id == CAP_ID_PCIE {
            return u16_at(config, offset + 8).map_or(ConfigFact::Unreadable, |ctl| {
                ConfigFact::Known(ctl & DEVCTL_RELAXED_ORDERING != 0)
            });
        }
        offset = usize::from(next & !3);
    }
    ConfigFact::Absent
}

/// Whether a path component names a PCI function (`0000:3b:00.0`).
fn is_pci_function(component: &str) -> bool {
    let b = component.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// The bridges a peer-to-peer transfer between two PCI functions crosses below their common
/// ancestor (the ports whose ACS setting matters), and whether they meet only at the root complex.
pub(crate) fn bridges_between(a: &Path, b: &Path) -> (Vec<PathBuf>, bool) {
    let ca: Vec<_> = a.components().collect();
    let cb: Vec<_> = b.components().collect();
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    let at_root = !ca[..common]
        .iter()
        .any(|c| is_pci_function(&c.as_os_str().to_string_lossy()));
    let mut bridges = Vec::new();
    for path in [&ca, &cb] {
        // Everything after the common ancestor except the endpoint itself.
        for end in common + 1..path.len() {
            let dir: PathBuf = path[..end].iter().collect();
            let last = path[end - 1].as_os_str().to_string_lossy();
            if is_pci_function(&last) {
                bridges.push(dir);
            }
        }
    }
    (bridges, at_root)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 4 KiB config space with a PCIe capability (Relaxed Ordering as given) and, when
    /// `acs` is `Some`, an ACS extended capability behind an AER one.
    pub(crate) fn config_space(relaxed: bool, acs: Option<u16>) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        c[0x06] = 1 << 4; // capability list present
        c[0x34] = 0x40;
        c[0x40] = 0x01; // power management
        c[0x41] = 0x60;
        c[0x60] = CAP_ID_PCIE;
        c[0x61] = 0x00;
        let devctl: u16 = if relaxed { DEVCTL_RELAXED_ORDERING } else { 0 } | 0x2000;
        c[0x68..0x6a].copy_from_slice(&devctl.to_le_bytes());
        // AER at 0x100 pointing at 0x148.
        let aer: u32 = 0x0001 | (1 << 16) | (0x148 << 20);
        c[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
        if let Some(ctl) = acs {
            let hdr: u32 = u32::from(EXT_CAP_ID_ACS) | (1 << 16);
            c[0x148..0x14c].copy_from_slice(&hdr.to_le_bytes());
            c[0x14c..0x14e].copy_from_slice(&0x5fu16.to_le_bytes());
            c[0x14e..0x150].copy_from_slice(&ctl.to_le_bytes());
        }
        c
    }

    #[test]
    fn finds_acs_control_behind_other_capabilities() {
        assert_eq!(
            acs_control(&config_space(false, Some(0x1d))),
            ConfigFact::Known(0x1d)
        );
        assert!(acs_redirects(0x1d));
        assert!(!acs_redirects(0x11));
        assert_eq!(acs_control(&config_space(false, None)), ConfigFact::Absent);
        assert_eq!(
            acs_control(&config_space(false, Some(0))[..64]),
            ConfigFact::Unreadable
        );
    }

    #[test]
    fn looping_capability_lists_end() {
        let mut c = config_space(false, None);
        let looping: u32 = 0x0001 | (0x100 << 20);
        c[0x100..0x104].copy_from_slice(&looping.to_le_bytes());
        assert_eq!(acs_control(&c), ConfigFact::Absent);
        c[0x61] = 0x60;
        c[0x60] = 0x05;
        assert_eq!(relaxed_ordering(&c), ConfigFact::Absent);
    }

    #[test]
    fn reads_relaxed_ordering() {
        assert_eq!(
            relaxed_ordering(&config_space(true, None)),
            ConfigFact::Known(true)
        );
        assert_eq!(
            relaxed_ordering(&config_space(false, None)),
            ConfigFact::Known(false)
        );
        assert_eq!(
            relaxed_ordering(&config_space(true, None)[..64]),
            ConfigFact::Unreadable
        );
    }

    #[test]
    fn bridges_below_the_common_switch() {
        let nic = Path::new(
            "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0/0000:03:00.0",
        );
        let gpu = Path::new(
            "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:02.0/0000:04:00.0",
        );
        let (bridges, at_root) = bridges_between(nic, gpu);
        assert!(!at_root);
        assert_eq!(
            bridges,
            vec![
                PathBuf::from("/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0"),
                PathBuf::from("/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:02.0"),
            ]
        );
        let far = Path::new("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        let (bridges, at_root) = bridges_between(nic, far);
        assert!(at_root);
        assert_eq!(bridges.len(), 4);
    }
}
