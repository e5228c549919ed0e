//! Rate cards: per resource class a price per unit-hour for guaranteed and
//! for spot VMs, in force from a given time until the next card. A card
//! never changes what was charged before it took effect.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::Level;

/// `gpu:<model>` (per GPU), `borrowed_gpu:<model>` (per GPU of a VM
/// above its tenant's guaranteed share; priced as `gpu:<model>` where a
/// card leaves it out), `spare_gpu:<model>` (per GPU of a training
/// cluster's spare capacity, held while the cluster lives),
/// `reserved_gpu:<model>` (per GPU a reservation holds, from its start to
/// its end), `vcpu`, `memory_gib`, `disk_gib`,
/// `public_ip` (per address held), `volume_gib`, `snapshot_gib` and
/// `share_gib` (per GiB of volume, snapshot or project share held).
pub type Class = String;

pub fn gpu_class(model: &str) -> Class {
    format!("gpu:{model}")
}

pub fn spare_gpu_class(model: &str) -> Class {
    format!("spare_gpu:{model}")
}

pub fn reserved_gpu_class(model: &str) -> Class {
    format!("reserved_gpu:{model}")
}

const BORROWED_GPU: &str = "borrowed_gpu:";

pub fn borrowed_gpu_class(model: &str) -> Class {
    format!("{BORROWED_GPU}{model}")
}

/// Whether a class is a GPU's (what a VM's GPUs are charged under, borrowed
/// or not).
pub fn is_vm_gpu_class(class: &str) -> bool {
    class.starts_with("gpu:") || class.starts_with(BORROWED_GPU)
}

pub const VCPU: &str = "vcpu";
pub const MEMORY_GIB: &str = "memory_gib";
pub const DISK_GIB: &str = "disk_gib";
pub const PUBLIC_IP: &str = "public_ip";
pub const VOLUME_GIB: &str = "volume_gib";
pub const SNAPSHOT_GIB: &str = "snapshot_gib";
pub const SHARE_GIB: &str = "share_gib";

/// Every class but the GPUs' (`gpu:<model>`, one per model).
pub const FLAT_CLASSES: [&str; 7] = [
    VCPU,
    MEMORY_GIB,
    DISK_GIB,
    PUBLIC_IP,
    VOLUME_GIB,
    SNAPSHOT_GIB,
    SHARE_GIB,
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub guaranteed: Decimal,
    pub spot: Decimal,
}

impl Price {
    pub fn of(&self, level: Level) -> Decimal {
        match level {
            Level::Guaranteed => self.guaranteed,
            Level::Spot => self.spot,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateCard {
    pub effective_from: DateTime<Utc>,
    pub prices: BTreeMap<Class, Price>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("{class}: prices must not be negative")]
    Negative { class: Class },
    #[error("{class}: the spot price is above the guaranteed one")]
    SpotAboveGuaranteed { class: Class },
    #[error("{0:?} is not a resource class (gpu:<model>, borrowed_gpu:<model>, spare_gpu:<model>, reserved_gpu:<model>, vcpu, memory_gib, disk_gib, public_ip, volume_gib, snapshot_gib, share_gib)")]
    UnknownClass(String),
}

impl RateCard {
    pub fn validate(&self) -> Result<(), RateError> {
        for (class, p) in &self.prices {
            let known = FLAT_CLASSES.contains(&class.as_str())
                || ["gpu:", BORROWED_GPU, "spare_gpu:", "reserved_gpu:"]
                    .iter()
                    .any(|p| {
                        class
                            .strip_prefix(p)
                            .is_some_and(|m| !m.is_empty() && m.len() <= 64)
                    });
            if !known {
                return Err(RateError::UnknownClass(class.clone()));
            }
            if p.guaranteed.is_sign_negative() || p.spot.is_sign_negative() {
                return Err(RateError::Negative {
                    class: class.clone(),
                });
            }
            if p.spot > p.guaranteed {
                return Err(RateError::SpotAboveGuaranteed {
                    class: class.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Every card, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateBook {
    cards: Vec<RateCard>,
}

impl RateBook {
    pub fn new(mut cards: Vec<RateCard>) -> RateBook {
        cards.sort_by_key(|c| c.effective_from);
        RateBook { cards }
    }

    pub fn cards(&self) -> &[RateCard] {
        &self.cards
    }

    /// The card in force at `t`.
    pub fn at(&self, t: DateTime<Utc>) -> Option<&RateCard> {
        self.cards.iter().rev().find(|c| c.effective_from <= t)
    }

    /// The price per unit-hour of `class` at `t` (zero where no card
    /// prices it: nothing is charged for what has no price).
    pub fn price(&self, t: DateTime<Utc>, class: &str, level: Level) -> Decimal {
        let card = self.at(t);
        // A borrowed GPU costs a GPU where the card sets no borrow rate.
        let fallback = class
            .strip_prefix(BORROWED_GPU)
            .map(gpu_class)
            .and_then(|c| card?.prices.get(&c));
        card.and_then(|c| c.prices.get(class))
            .or(fallback)
            .map(|p| p.of(level))
            .unwrap_or(Decimal::ZERO)
    }

    /// Times strictly between `from` and `to` at which a card takes effect.
    pub fn changes_within(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        self.cards
            .iter()
            .map(|c| c.effective_from)
            .filter(move |t| from < *t && *t < to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(class: &str) -> RateCard {
        let price = Price {
            guaranteed: Decimal::ONE,
            spot: Decimal::ZERO,
        };
        RateCard {
            effective_from: DateTime::<Utc>::UNIX_EPOCH,
            prices: [(class.to_owned(), price)].into(),
        }
    }

    #[test]
    fn cards_price_gpus_spare_gpus_and_the_flat_classes_only() {
        for class in [
            gpu_class("H100-SXM5-80GB"),
            spare_gpu_class("H100-SXM5-80GB"),
            reserved_gpu_class("H100-SXM5-80GB"),
            borrowed_gpu_class("H100-SXM5-80GB"),
        ]
        .into_iter()
        .chain(FLAT_CLASSES.map(str::to_owned))
        {
            assert_eq!(card(&class).validate(), Ok(()), "{class}");
        }
        for class in [
            "spare_gpu:",
            "gpu:",
            "borrowed_gpu:",
            "spare_vcpu",
            "gpus:H100",
        ] {
            assert_eq!(
                card(class).validate(),
                Err(RateError::UnknownClass(class.to_owned()))
            );
        }
    }

    /// A borrowed GPU costs the borrow rate where the card sets one, and a
    /// GPU's rate where it does not (never nothing).
    #[test]
    fn borrowed_gpus_cost_a_gpu_unless_a_borrow_rate_is_set() {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        let borrowed = borrowed_gpu_class("H100");
        let book = RateBook::new(vec![card(&gpu_class("H100"))]);
        assert_eq!(book.price(t, &borrowed, Level::Guaranteed), Decimal::ONE);
        let mut with = card(&gpu_class("H100"));
        with.prices.insert(
            borrowed.clone(),
            Price {
                guaranteed: Decimal::TWO,
                spot: Decimal::ZERO,
            },
        );
        let book = RateBook::new(vec![with]);
        assert_eq!(book.price(t, &borrowed, Level::Guaranteed), Decimal::TWO);
        assert_eq!(
            book.price(t, &gpu_class("H100"), Level::Guaranteed),
            Decimal::ONE
        );
        assert!(is_vm_gpu_class(&borrowed) && is_vm_gpu_class("gpu:H100"));
        assert!(!is_vm_gpu_class("spare_gpu:H100"));
    }
}
