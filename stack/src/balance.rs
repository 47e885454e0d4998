//! Power-of-two-choices balancing over the replicas of one model version.
//!
//! tower's p2c `Balance`: pick two ready replicas at random, send to the one
//! with the lower load. Load is [`crate::load::Measured`]: a peak-EWMA
//! latency estimate times (in-flight + 1), where a failure counts as a
//! per-try timeout's worth of latency. So the retry that follows a failure
//! or a timeout goes to the other replica instead of, half the time, the
//! same one (which is what happened with a plain in-flight count, and with
//! tower's `PeakEwma` for replicas that fail fast). Only replicas whose
//! `poll_ready` is `Ready` are candidates, and the chosen one is re-checked
//! just before dispatch, so a replica whose breaker is open (its
//! `poll_ready` is `Pending`) is never picked. PeakEwma uses tokio's clock,
//! so paused-time tests stay deterministic.

use std::hash::Hash;
use std::marker::PhantomData;

use tower::balance::p2c::Balance;
use tower::discover::Discover;
use tower::util::rng::Rng;
use tower::{Layer, Service};

use crate::error::BoxError;

/// Builds p2c balancers over a `Discover`, for requests of type `Req`.
#[derive(Debug)]
pub struct BalanceLayer<Req> {
    seed: Option<u64>,
    _req: PhantomData<fn(Req)>,
}

impl<Req> Clone for BalanceLayer<Req> {
    fn clone(&self) -> Self {
        BalanceLayer {
            seed: self.seed,
            _req: PhantomData,
        }
    }
}

/// The p2c layer; `seed` fixes its random choices (tests only).
pub fn layer<Req>(seed: Option<u64>) -> BalanceLayer<Req> {
    BalanceLayer {
        seed,
        _req: PhantomData,
    }
}

impl<D, Req> Layer<D> for BalanceLayer<Req>
where
    D: Discover,
    D::Key: Hash,
    D::Service: Service<Req>,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
{
    type Service = Balance<D, Req>;

    fn layer(&self, discover: D) -> Balance<D, Req> {
        match self.seed {
            Some(seed) => Balance::from_rng(discover, SplitMix64(seed)),
            None => Balance::from_rng(discover, tower::util::rng::HasherRng::default()),
        }
    }
}

/// A tiny deterministic generator for seeded balancers.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
