//! `cairn`: the command-line tool over a Cairn store (work in progress: see the README's
//! capability table).

fn main() {
    eprintln!("cairn: the command-line tool is not built yet; use the library or the examples");
    std::process::exit(2);
}
