//! Bakes the default preferred endpoint into the library: a site can build its own default
//! with `PREFERRED_ENDPOINT_DEFAULT=pod3 cargo build --release`.

fn main() {
    println!("cargo:rerun-if-env-changed=PREFERRED_ENDPOINT_DEFAULT");
    let default = std::env::var("PREFERRED_ENDPOINT_DEFAULT").unwrap_or_default();
    if default.contains(['"', '\\']) || default.chars().any(char::is_control) {
        panic!("PREFERRED_ENDPOINT_DEFAULT must be a plain endpoint name, got {default:?}");
    }
    println!("cargo:rustc-env=PREFERRED_ENDPOINT_DEFAULT={default}");
}
