//! Embeds the browser libraries npm installed under `assets/node_modules`
//! (`./x start` and `./x test` install them; they are not committed). A
//! build without them embeds nothing, and the console page says how to
//! get them.

use std::path::Path;

const FILES: &[(&str, &str)] = &[
    ("assets/node_modules/@xterm/xterm/lib/xterm.js", "xterm.js"),
    (
        "assets/node_modules/@xterm/xterm/css/xterm.css",
        "xterm.css",
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::var("OUT_DIR")?;
    println!("cargo::rerun-if-changed=assets/node_modules/.package-lock.json");
    for (from, to) in FILES {
        println!("cargo::rerun-if-changed={from}");
        let mut body = std::fs::read(from).unwrap_or_default();
        // The source map is not served.
        if let Some(i) = body
            .windows(21)
            .rposition(|w| w == b"//# sourceMappingURL=")
        {
            body.truncate(i);
        }
        std::fs::write(Path::new(&out).join(to), body)?;
    }
    Ok(())
}
