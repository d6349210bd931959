fn main() {
    if let Err(e) = starling_bench::main_entry() {
        eprintln!("starling-bench: {e:#}");
        std::process::exit(1);
    }
}
