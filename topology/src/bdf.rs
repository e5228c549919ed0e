//! PCI addresses (`dddd:bb:dd.f`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A PCI function address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a PCI address like 0000:07:00.0")]
pub struct BdfError(pub String);

impl Bdf {
    pub const fn new(domain: u16, bus: u8, device: u8, function: u8) -> Bdf {
        Bdf {
            domain,
            bus,
            device,
            function,
        }
    }

    /// The same device's function 0: NCCL names a NIC by it (VFs merged).
    pub fn function0(self) -> Bdf {
        Bdf {
            function: 0,
            ..self
        }
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for Bdf {
    type Err = BdfError;

    fn from_str(s: &str) -> Result<Bdf, BdfError> {
        let err = || BdfError(s.to_owned());
        let (domain, rest) = s.split_once(':').ok_or_else(err)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(err)?;
        let (device, function) = rest.split_once('.').ok_or_else(err)?;
        let hex = |v: &str, len: usize| {
            if v.len() == len && v.bytes().all(|b| b.is_ascii_hexdigit()) {
                u32::from_str_radix(v, 16).map_err(|_| err())
            } else {
                Err(err())
            }
        };
        let domain = hex(domain, 4)?;
        let bus = hex(bus, 2)?;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 0x1f || function > 7 {
            return Err(err());
        }
        Ok(Bdf::new(
            domain as u16,
            bus as u8,
            device as u8,
            function as u8,
        ))
    }
}

impl Serialize for Bdf {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Bdf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bdf, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_lowercase() {
        let b: Bdf = "0000:C4:00.0".parse().unwrap();
        assert_eq!(b, Bdf::new(0, 0xc4, 0, 0));
        assert_eq!(b.to_string(), "0000:c4:00.0");
        assert_eq!(
            "0001:0a:1f.7".parse::<Bdf>().unwrap().to_string(),
            "0001:0a:1f.7"
        );
    }

    #[test]
    fn rejects_what_is_not_a_bdf() {
        for bad in [
            "",
            "pci0000:00",
            "0000:00:00",
            "0000:00:20.0",
            "0000:00:00.8",
            "000:00:00.0",
            "0000:0g:00.0",
            "0000:00:00.0\n",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn function_zero() {
        assert_eq!(Bdf::new(0, 0x1a, 0, 3).function0(), Bdf::new(0, 0x1a, 0, 0));
    }
}
