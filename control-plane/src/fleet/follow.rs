//! Keeps [`Fleet::current`] at the database's generation: reloads after local changes, on
//! PostgreSQL notifications from other instances (LISTEN), and on a short poll that covers a
//! lost notification or a dropped listener connection.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::task::JoinHandle;

use super::Fleet;
use crate::db::{Backend, NOTIFY_CHANNEL};

/// How often the generation is polled besides notifications.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Starts following; the tasks run until the process ends.
pub fn spawn(fleet: Arc<Fleet>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let f = fleet.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = f.refresh.notified() => {}
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
            if let Err(e) = f.reload().await {
                tracing::warn!(error = %e, "cannot reload the desired state; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }));
    if fleet.db.backend() == Backend::Postgres {
        tasks.push(tokio::spawn(listen(fleet)));
    }
    tasks
}

async fn listen(fleet: Arc<Fleet>) {
    loop {
        let Err(e) = listen_once(&fleet).await;
        tracing::warn!(error = %e, "lost the PostgreSQL notification listener; reconnecting (polling meanwhile)");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_once(fleet: &Fleet) -> Result<std::convert::Infallible, sqlx::Error> {
    let mut listener = PgListener::connect(fleet.db.url()).await?;
    listener.listen(NOTIFY_CHANNEL).await?;
    // Changes made while nobody listened.
    fleet.changed();
    loop {
        listener.recv().await?;
        fleet.changed();
    }
}
