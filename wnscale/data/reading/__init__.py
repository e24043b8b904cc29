"""Reading stores for training: one module per store format (WeatherBench2 zarr, anemoi-datasets,
point stores, regional cut-outs), the registry of formats (`store_formats`), observation stores
and the normalization statistics read or computed from a store. Nothing here writes a store
(that is `wnscale.data.making`)."""
