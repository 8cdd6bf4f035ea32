//! Summary statistics of seeds and curves.

/// Mean and sample standard deviation (0 for fewer than two values; the
/// mean of nothing is 0).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n.max(1.0);
    let std = if values.len() < 2 {
        0.0
    } else {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    (mean, std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_std() {
        assert_eq!(mean_std(&[]), (0.0, 0.0));
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_std(&[0.1, 0.3]);
        assert!((m - 0.2).abs() < 1e-12 && (s - 0.1414213562).abs() < 1e-9);
    }
}
