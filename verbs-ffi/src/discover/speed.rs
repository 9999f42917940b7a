//! Port speed from `active_speed` / `active_width` (pure).
//!
//! Like NCCL's `ncclIbSpeed`/`ncclIbWidth`: the lowest set bit of each field indexes a table;
//! speed in Mb/s = lane rate × lanes. RoCE ports report the Ethernet rate this way too (100GbE →
//! EDR × 4 = 100000).

/// Lane rate in Mb/s per `active_speed` bit: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR.
pub const LANE_MBPS: [u32; 9] = [
    2_500, 5_000, 10_000, 10_000, 14_000, 25_000, 50_000, 100_000, 200_000,
];
/// Lanes per `active_width` bit: 1x, 4x, 8x, 12x, 2x.
pub const WIDTH_LANES: [u32; 5] = [1, 4, 8, 12, 2];

fn lowest_bit<const N: usize>(bits: u32, table: &[u32; N]) -> Option<u32> {
    if bits == 0 {
        return None;
    }
    table.get(bits.trailing_zeros() as usize).copied()
}

/// Lane rate for an `active_speed` (or `active_speed_ex`) value; `None` if no known bit is set.
pub fn lane_mbps(speed_bits: u32) -> Option<u32> {
    lowest_bit(speed_bits, &LANE_MBPS)
}

/// Lanes for an `active_width` value; `None` if no known bit is set.
pub fn width_lanes(width_bits: u8) -> Option<u32> {
    lowest_bit(u32::from(width_bits), &WIDTH_LANES)
}

/// Port speed in Mb/s. `active_speed_ex` (0 when unknown) takes precedence over `active_speed`.
pub fn port_speed_mbps(active_speed: u8, active_speed_ex: u32, active_width: u8) -> Option<u32> {
    let bits = if active_speed_ex != 0 {
        active_speed_ex
    } else {
        u32::from(active_speed)
    };
    Some(lane_mbps(bits)? * width_lanes(active_width)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_combinations() {
        assert_eq!(
            port_speed_mbps(1, 0, 1),
            Some(2_500),
            "SDR 1x (rxe default)"
        );
        assert_eq!(port_speed_mbps(32, 0, 2), Some(100_000), "EDR 4x / 100GbE");
        assert_eq!(port_speed_mbps(64, 0, 2), Some(200_000), "HDR 4x");
        assert_eq!(port_speed_mbps(128, 0, 2), Some(400_000), "NDR 4x");
        assert_eq!(
            port_speed_mbps(0, 256, 2),
            Some(800_000),
            "XDR 4x via active_speed_ex"
        );
        assert_eq!(port_speed_mbps(16, 0, 8), Some(168_000), "FDR 12x");
        assert_eq!(port_speed_mbps(4, 0, 16), Some(20_000), "QDR 2x");
    }

    #[test]
    fn lowest_bit_wins() {
        assert_eq!(lane_mbps(32 | 64), Some(25_000));
        assert_eq!(width_lanes(2 | 4), Some(4));
    }

    #[test]
    fn unknown_values_are_none() {
        assert_eq!(port_speed_mbps(0, 0, 2), None);
        assert_eq!(port_speed_mbps(32, 0, 0), None);
        assert_eq!(width_lanes(32), None);
        assert_eq!(lane_mbps(1 << 9), None);
    }
}
