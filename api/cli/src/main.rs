//! `webhooks-api`: the program is [`webhooks_api::main`].

/// mimalloc rather than the system's allocator: a delivery allocates and
/// frees many small buffers across threads, where glibc's malloc spent about
/// 3% of a dispatcher's CPU (`perf`, draining a queue).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    webhooks_api::main().await
}
