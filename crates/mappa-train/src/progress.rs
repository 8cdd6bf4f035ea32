//! Progress bars on stderr for long work (training steps, warm starts,
//! studies, coach scoring), all in one style.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` items drawn with indicatif's `template` (with
/// `{bar:30}` in it), or a hidden one when `shown` is false.
pub fn bar(len: usize, template: &str, shown: bool) -> ProgressBar {
    let bar = if shown {
        ProgressBar::new(len as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}
