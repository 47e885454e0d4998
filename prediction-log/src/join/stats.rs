//! The numbers of the join: ROC AUC, Brier score, precision/recall, percentiles.

/// ROC AUC by the Mann-Whitney U statistic with tied scores given their average rank
/// (a tie between a positive and a negative counts one half). `None` unless there is at
/// least one positive and one negative. Non-finite scores must be filtered out first.
pub fn roc_auc(pairs: &mut [(f64, bool)]) -> Option<f64> {
    let pos = pairs.iter().filter(|p| p.1).count();
    let neg = pairs.len() - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum_pos = 0.0f64;
    let mut i = 0;
    while i < pairs.len() {
        let mut j = i;
        while j + 1 < pairs.len() && pairs[j + 1].0 == pairs[i].0 {
            j += 1;
        }
        // ranks i+1 ..= j+1 share their average
        let avg_rank = (i + j + 2) as f64 / 2.0;
        let pos_here = pairs[i..=j].iter().filter(|p| p.1).count();
        rank_sum_pos += avg_rank * pos_here as f64;
        i = j + 1;
    }
    let (pos, neg) = (pos as f64, neg as f64);
    Some((rank_sum_pos - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

/// Mean squared difference between score and outcome (scores are taken as probabilities).
pub fn brier(pairs: &[(f64, bool)]) -> Option<f64> {
    if pairs.is_empty() {
        return None;
    }
    let sum: f64 = pairs
        .iter()
        .map(|(s, y)| {
            let d = s - if *y { 1.0 } else { 0.0 };
            d * d
        })
        .sum();
    Some(sum / pairs.len() as f64)
}

/// Nearest-rank percentile (`q` in 0..=1) of sorted values.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Confusion counts of one operating point.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Confusion {
    pub tp: u64,
    pub fp: u64,
    pub fn_: u64,
    pub tn: u64,
}

impl Confusion {
    pub fn add(&mut self, flagged: bool, label: bool) {
        match (flagged, label) {
            (true, true) => self.tp += 1,
            (true, false) => self.fp += 1,
            (false, true) => self.fn_ += 1,
            (false, false) => self.tn += 1,
        }
    }
    pub fn precision(&self) -> Option<f64> {
        let d = self.tp + self.fp;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }
    pub fn recall(&self) -> Option<f64> {
        let d = self.tp + self.fn_;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auc(v: &[(f64, bool)]) -> Option<f64> {
        roc_auc(&mut v.to_vec())
    }

    #[test]
    fn auc_hand_cases() {
        assert_eq!(
            auc(&[(0.1, false), (0.2, false), (0.8, true), (0.9, true)]),
            Some(1.0)
        );
        assert_eq!(
            auc(&[(0.1, true), (0.2, true), (0.8, false), (0.9, false)]),
            Some(0.0)
        );
        assert_eq!(
            auc(&[(0.5, true), (0.5, false), (0.5, true), (0.5, false)]),
            Some(0.5)
        );
        // One inversion out of 2*2 pairs: 3/4.
        assert_eq!(
            auc(&[(0.1, false), (0.3, true), (0.4, false), (0.5, true)]),
            Some(0.75)
        );
        // A tie between one positive and one negative counts a half: (1 + 0.5) / 2.
        assert_eq!(auc(&[(0.1, false), (0.5, false), (0.5, true)]), Some(0.75));
        assert_eq!(auc(&[(0.1, true), (0.2, true)]), None);
        assert_eq!(auc(&[]), None);
    }

    #[test]
    fn brier_and_percentiles() {
        assert_eq!(brier(&[(1.0, true), (0.0, false)]), Some(0.0));
        assert_eq!(brier(&[(0.5, true), (0.5, false)]), Some(0.25));
        assert_eq!(brier(&[(0.0, true)]), Some(1.0));
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn confusion() {
        let mut c = Confusion::default();
        c.add(true, true);
        c.add(true, false);
        c.add(false, true);
        c.add(false, true);
        assert_eq!(c.precision(), Some(0.5));
        assert_eq!(c.recall(), Some(1.0 / 3.0));
        assert_eq!(Confusion::default().precision(), None);
    }
}
