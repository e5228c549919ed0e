//! Progress of long waits (`--wait`, device sign-in): a spinner with the
//! current state and the time spent, on stderr when it is a terminal.
//! Elsewhere (scripts, CI, tests) nothing is drawn; only lines worth
//! keeping are printed.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    what: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A spinner saying `what` is going on, if stderr is a terminal (not
    /// a dumb one: `TERM` set, and not to `dumb`).
    pub fn start(what: impl Into<String>) -> Progress {
        let what = what.into();
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(what.clone());
            bar
        });
        // indicatif hides itself on dumb terminals.
        let bar = bar.filter(|b| !b.is_hidden());
        if let Some(b) = &bar {
            b.enable_steady_tick(Duration::from_millis(120));
        }
        Progress { what, bar }
    }

    /// Shows the current state: `what: state`.
    pub fn set(&self, state: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(message(&self.what, state));
        }
    }

    /// A line worth keeping (printed above the spinner, or plainly).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The spinner's text.
fn message(what: &str, state: &str) -> String {
    if state.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {state}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_state() {
        assert_eq!(
            message("waiting for web to run", "provisioning"),
            "waiting for web to run: provisioning"
        );
        assert_eq!(message("waiting", ""), "waiting");
    }

    #[test]
    fn without_a_terminal_nothing_is_drawn() {
        // `cargo test` captures stderr: no terminal, no spinner.
        if !std::io::stderr().is_terminal() {
            let p = Progress::start("waiting");
            assert!(p.bar.is_none());
            p.set("pending");
        }
    }
}
