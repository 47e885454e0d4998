//! The demo's synthetic world: cards, merchants and transactions whose fraud
//! follows the rule the reference model was trained on.
//!
//! The reference data set labels a transaction by a score over its 32 model inputs
//! `x0..x31` (see tests/data/README.md: `1.5 x0 x1 + sin(2 x2) x3 + ...`, plus noise,
//! top 2% is fraud). Here the inputs are not drawn directly: the world draws card,
//! merchant and transaction attributes (counts, amounts, rates, a category), the
//! mesh turns them into the 32 inputs with the example model's `[input_spec]`
//! (request `amount`; `card:*` at 1..7; `merchant:*` at 8..13; the category one-hot
//! at 14..17; request `f18..f31`), and the world's truth is the same score over
//! those inputs. `x` below is therefore what the input spec computes from the
//! stored values; the world keeps it to decide which transactions turn out to be
//! fraud. Nothing here is given to the mesh but the raw attributes.
use mesh_feature_store::{EntityKey, Micros, Row, Value, ViewInfo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const CATEGORIES: [&str; 4] = ["grocery", "travel", "electronics", "gaming"];

fn normal(rng: &mut impl Rng) -> f64 {
    // Box-Muller.
    let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// A card's stored features and the model inputs x1..x7 they become.
pub struct Card {
    pub id: i64,
    txn_count_1h: i64,
    txn_count_24h: i64,
    amount_sum_24h: f32,
    avg_amount_30d: f32,
    max_amount_7d: f32,
    distinct_merchants_7d: i64,
    declined_count_24h: i64,
    x: [f64; 7],
}

/// A merchant's stored features and the model inputs x8..x13 they become.
pub struct Merchant {
    pub id: String,
    chargeback_rate_90d: f32,
    refund_rate_30d: f32,
    txn_count_24h: i64,
    avg_ticket_30d: f32,
    risk_tier: i64,
    is_high_risk_mcc: bool,
    x: [f64; 6],
}

fn ln1p(v: f64) -> f64 {
    v.max(0.0).ln_1p()
}

impl Card {
    fn draw(id: i64, rng: &mut impl Rng) -> Self {
        let txn_count_1h = normal(rng).abs().exp_m1().floor() as i64;
        let txn_count_24h = txn_count_1h + (normal(rng).abs() * 1.5).exp_m1().floor() as i64;
        let amount_sum_24h = (6.0 + 1.5 * normal(rng)).exp_m1() as f32;
        let avg_amount_30d = (4.0 + normal(rng)).exp_m1() as f32;
        let max_amount_7d = (5.0 + 1.2 * normal(rng)).exp_m1() as f32;
        let distinct_merchants_7d = normal(rng).abs().exp_m1().floor() as i64;
        let declined_count_24h = (normal(rng).abs() * 1.2).floor() as i64;
        let x = [
            ln1p(txn_count_1h as f64),
            ln1p(txn_count_24h as f64),
            (ln1p(f64::from(amount_sum_24h)) - 6.0) / 1.5,
            ln1p(f64::from(avg_amount_30d)) - 4.0,
            (ln1p(f64::from(max_amount_7d)) - 5.0) / 1.2,
            ln1p(distinct_merchants_7d as f64),
            (declined_count_24h as f64).clamp(0.0, 5.0),
        ];
        Self {
            id,
            txn_count_1h,
            txn_count_24h,
            amount_sum_24h,
            avg_amount_30d,
            max_amount_7d,
            distinct_merchants_7d,
            declined_count_24h,
            x,
        }
    }

    fn value(&self, feature: &str) -> Option<Value> {
        Some(match feature {
            "txn_count_1h" => Value::I64(self.txn_count_1h),
            "txn_count_24h" => Value::I64(self.txn_count_24h),
            "amount_sum_24h" => Value::F32(self.amount_sum_24h),
            "avg_amount_30d" => Value::F32(self.avg_amount_30d),
            "max_amount_7d" => Value::F32(self.max_amount_7d),
            "distinct_merchants_7d" => Value::I64(self.distinct_merchants_7d),
            "declined_count_24h" => Value::I64(self.declined_count_24h),
            "home_country" => Value::String("US".into()),
            _ => return None,
        })
    }
}

impl Merchant {
    fn draw(i: usize, rng: &mut impl Rng) -> Self {
        let chargeback_rate_90d = (0.01 + 0.01 * normal(rng)).max(0.0) as f32;
        let refund_rate_30d = (0.05 + 0.03 * normal(rng)).max(0.0) as f32;
        let txn_count_24h = (5.0 + 2.0 * normal(rng)).exp_m1().round().max(0.0) as i64;
        let avg_ticket_30d = (4.0 + normal(rng)).exp_m1() as f32;
        let risk_tier = rng.random_range(1..=4i64);
        let is_high_risk_mcc = rng.random::<f64>() < 0.1;
        let x = [
            (f64::from(chargeback_rate_90d) - 0.01) / 0.01,
            (f64::from(refund_rate_30d) - 0.05) / 0.03,
            (ln1p(txn_count_24h as f64) - 5.0) / 2.0,
            ln1p(f64::from(avg_ticket_30d)) - 4.0,
            risk_tier as f64 - 2.0,
            f64::from(u8::from(is_high_risk_mcc)),
        ];
        Self {
            id: format!("m{:06}", i + 1),
            chargeback_rate_90d,
            refund_rate_30d,
            txn_count_24h,
            avg_ticket_30d,
            risk_tier,
            is_high_risk_mcc,
            x,
        }
    }

    fn value(&self, feature: &str) -> Option<Value> {
        Some(match feature {
            "chargeback_rate_90d" => Value::F32(self.chargeback_rate_90d),
            "refund_rate_30d" => Value::F32(self.refund_rate_30d),
            "txn_count_24h" => Value::I64(self.txn_count_24h),
            "avg_ticket_30d" => Value::F32(self.avg_ticket_30d),
            "risk_tier" => Value::I64(self.risk_tier),
            "is_high_risk_mcc" => Value::Bool(self.is_high_risk_mcc),
            _ => return None,
        })
    }
}

/// One transaction as a caller sends it, and its hidden fraud score.
pub struct Txn {
    pub card: i64,
    pub merchant: String,
    pub amount: f64,
    pub category: &'static str,
    /// Request features f18..f31.
    pub extra: [f64; 14],
    /// The world's fraud score (noise included); the top 2% turn out to be fraud.
    pub truth: f64,
}

/// The generating rule of the reference data over inputs x0..x15.
pub fn fraud_score(x: &[f64; 16]) -> f64 {
    1.5 * x[0] * x[1]
        + (2.0 * x[2]).sin() * x[3]
        + 0.8 * (x[4] - x[5]).max(0.0)
        + 0.5 * (x[6] * x[6] - 1.0)
        - 0.6 * x[7].abs()
        + 0.25 * x[8..16].iter().sum::<f64>() / 8f64.sqrt()
}

pub struct World {
    pub cards: Vec<Card>,
    pub merchants: Vec<Merchant>,
}

impl World {
    pub fn new(n_cards: usize, n_merchants: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let cards = (0..n_cards)
            .map(|i| Card::draw(i as i64 + 1, &mut rng))
            .collect();
        let merchants = (0..n_merchants)
            .map(|i| Merchant::draw(i, &mut rng))
            .collect();
        Self { cards, merchants }
    }

    /// Rows for a view named `card` or `merchant`, with every feature the view
    /// declares that the world knows (others are null), at `event_time`.
    pub fn rows(&self, view: &ViewInfo, event_time: Micros) -> Vec<Row> {
        let names: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
        match view.name.as_str() {
            "card" => self
                .cards
                .iter()
                .map(|c| Row {
                    key: EntityKey::Int64(c.id),
                    event_time,
                    values: names.iter().map(|n| c.value(n)).collect(),
                })
                .collect(),
            "merchant" => self
                .merchants
                .iter()
                .map(|m| Row {
                    key: EntityKey::String(m.id.clone()),
                    event_time,
                    values: names.iter().map(|n| m.value(n)).collect(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A new transaction at a random card and merchant.
    pub fn transaction(&self, rng: &mut impl Rng) -> Txn {
        let card = &self.cards[rng.random_range(0..self.cards.len())];
        let merchant = &self.merchants[rng.random_range(0..self.merchants.len())];
        let amount = (4.0 + 1.2 * normal(rng)).exp_m1();
        let cat = rng.random_range(0..CATEGORIES.len());
        let mut extra = [0.0; 14];
        for e in &mut extra {
            *e = normal(rng);
        }
        let mut x = [0.0; 16];
        x[0] = (ln1p(amount) - 4.0) / 1.2;
        x[1..8].copy_from_slice(&card.x);
        x[8..14].copy_from_slice(&merchant.x);
        if cat < 2 {
            // Inputs 14 and 15 are the first two categories of the one-hot.
            x[14 + cat] = 1.0;
        }
        Txn {
            card: card.id,
            merchant: merchant.id.clone(),
            amount,
            category: CATEGORIES[cat],
            extra,
            truth: fraud_score(&x) + 0.25 * normal(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_are_reproducible_and_fraud_is_rare_but_present() {
        let w = World::new(500, 50, 3);
        let mut rng = StdRng::seed_from_u64(1);
        let t: Vec<f64> = (0..5000).map(|_| w.transaction(&mut rng).truth).collect();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(w.transaction(&mut rng).truth, t[0]);
        let mut s = t.clone();
        s.sort_by(f64::total_cmp);
        let cut = s[s.len() * 98 / 100];
        let above = t.iter().filter(|v| **v > cut).count();
        assert!((80..=120).contains(&above), "{above}");
        assert!(t.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn the_score_is_the_reference_rule() {
        let mut x = [0.0; 16];
        assert!((fraud_score(&x) + 0.5).abs() < 1e-12);
        x[0] = 2.0;
        x[1] = 1.0;
        x[7] = -1.0;
        assert!((fraud_score(&x) - (3.0 - 0.5 - 0.6)).abs() < 1e-12);
    }
}
