//! Means and standard deviations, as the metrics and reports use them.

/// Mean and population standard deviation (divided by n): the spread of
/// the values themselves, e.g. a step's advantages. `(0, 0)` for no values.
pub fn mean_population_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Mean and sample standard deviation (divided by n - 1): the spread of a
/// sample, e.g. final accuracies over seeds. The std is 0 for fewer than
/// two values; the mean of nothing is 0.
pub fn mean_sample_std(values: &[f64]) -> (f64, f64) {
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
    fn population_and_sample_spreads() {
        assert_eq!(mean_population_std(&[]), (0.0, 0.0));
        assert_eq!(mean_sample_std(&[]), (0.0, 0.0));
        assert_eq!(mean_sample_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_sample_std(&[0.1, 0.3]);
        assert!((m - 0.2).abs() < 1e-12 && (s - 0.1414213562).abs() < 1e-9);
        let (m, s) = mean_population_std(&[0.1, 0.3]);
        assert!((m - 0.2).abs() < 1e-12 && (s - 0.1).abs() < 1e-12);
    }
}
