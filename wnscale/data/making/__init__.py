"""Making stores: ERA5 files as the Climate Data Store delivers them converted into a store
(here or as an Apache Beam pipeline), the synthetic ERA5-like store and station network, and
the zarr layout writer they share. Training only reads stores (`wnscale.data.reading`)."""
