//! Tests that need a real RDMA device (Soft-RoCE in the VM lane). Ignored by default; run with
//! `vm/run.sh -- cargo test -p rivet-verbs-ffi --test device -- --ignored` (or the built test binary).

use std::time::Duration;

use rivet_verbs_ffi::discover::{DiscoverOptions, LinkLayer, NameList};
use rivet_verbs_ffi::selftest::loopback_write_imm;
use rivet_verbs_ffi::{Context, DeviceList, discover};

fn first_port() -> rivet_verbs_ffi::PortInfo {
    discover(&DiscoverOptions::default())
        .expect("a usable RDMA port")
        .remove(0)
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn discovers_an_active_port_with_a_gid() {
    let port = first_port();
    assert!(port.port >= 1);
    assert!(port.gid.iter().any(|b| *b != 0), "{port:?}");
    assert!(port.speed_mbps > 0, "{port:?}");
    assert!(port.max_qp > 0, "{port:?}");
    assert!(port.ptr_support.0 & 1 == 1);
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn filter_can_remove_every_port() {
    let port = first_port();
    let options = DiscoverOptions {
        filter: NameList::parse(&format!("^{}", port.name)).unwrap(),
        ..Default::default()
    };
    match discover(&options) {
        Err(rivet_verbs_ffi::DiscoverError::AllFilteredOut { ports, .. }) => {
            assert!(ports.contains(&format!("{}:{}", port.name, port.port)))
        }
        Ok(ports) => assert!(ports.iter().all(|p| p.name != port.name)),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn async_events_do_not_block() {
    let list = DeviceList::new().unwrap();
    let context: std::sync::Arc<Context> = list.get(0).expect("a device").open().unwrap();
    // Nothing has happened on a fresh context: this must return at once with None.
    assert!(context.get_async_event().unwrap().is_none());
    let attr = context.query_device().unwrap();
    assert!(attr.phys_port_cnt >= 1);
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn extended_port_query_agrees_with_the_compat_symbol() {
    let list = DeviceList::new().unwrap();
    let context = list.get(0).expect("a device").open().unwrap();
    let compat = context.query_port(1).unwrap();
    let extended = context.query_port_ex(1).unwrap();
    // The first 48 bytes come from the same provider call.
    let head = |a: &rivet_verbs_ffi::sys::ibv_port_attr| {
        (
            a.state,
            a.max_mtu,
            a.active_mtu,
            a.gid_tbl_len,
            a.port_cap_flags,
            a.lid,
            a.active_speed,
            a.active_width,
        )
    };
    assert_eq!(head(&compat), head(&extended));
    assert_eq!(
        (compat.link_layer, compat.flags),
        (extended.link_layer, extended.flags)
    );
    assert_eq!(
        (compat.port_cap_flags2, compat.active_speed_ex),
        (0, 0),
        "compat leaves the tail zeroed"
    );
    println!(
        "port_cap_flags2 {:#x} active_speed_ex {:#x}",
        extended.port_cap_flags2, extended.active_speed_ex
    );
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn loopback_write_with_imm_moves_one_mib() {
    let report = loopback_write_imm(&first_port(), 1 << 20, Duration::from_secs(30)).unwrap();
    assert_eq!(report.bytes, 1 << 20);
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn sysfs_gid_types_agree_with_query_gid_ex() {
    use rivet_verbs_ffi::discover::{Sysfs, sysfs};
    let port = first_port();
    if port.link_layer != LinkLayer::Ethernet {
        return; // GID types only matter on RoCE
    }
    let list = DeviceList::new().unwrap();
    let device = list.iter().find(|d| d.name() == port.name).unwrap();
    let context = device.open().unwrap();
    let table_len = context.query_port(port.port).unwrap().gid_tbl_len as u32;
    let device_dir = Sysfs::system().device_dir(device.ibdev_path().as_deref(), &port.name);
    let mut compared = 0;
    for index in 0..table_len {
        let Ok(entry) = context.query_gid_ex(port.port, index) else {
            continue;
        };
        let from_ex = if entry.gid_type == rivet_verbs_ffi::sys::gid_type::ROCE_V2 {
            2
        } else {
            1
        };
        assert_eq!(
            sysfs::gid_roce_version(&device_dir, port.port, index),
            Some(from_ex),
            "GID index {index}"
        );
        assert_eq!(
            context.query_gid(port.port, index).unwrap(),
            entry.gid,
            "GID index {index}"
        );
        compared += 1;
    }
    assert!(compared > 0, "no populated GID entries");
    println!("{compared} GID entries agree");
}

#[test]
#[ignore = "needs an RDMA device (vm/run.sh)"]
fn a_kernel_device_reports_its_class_directory_as_ibdev_path() {
    let list = DeviceList::new().unwrap();
    let device = list.get(0).expect("a device");
    let path = device.ibdev_path().expect("libibverbs fills ibdev_path");
    assert_eq!(
        path,
        std::path::Path::new("/sys/class/infiniband").join(device.name())
    );
    assert!(path.join("ports/1").is_dir(), "{}", path.display());
}
